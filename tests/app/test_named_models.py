"""Named models (issue 44): the settings that list them, how a request names one, and a service with two
models of different dimensions answering in-process over ASGI (each vector's length says which answered)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.service.engines import close_engines, load_engines
from app.service.errors import ApiError
from app.service.main import create_app
from app.service.model_registry import ModelRegistry
from app.settings import Settings
from harness.tiny_model import make_tiny_bert

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wide_bert(tmp_path_factory) -> Path:
    """A second tiny model, 48 wide where ``tiny_bert`` is 32."""
    return make_tiny_bert(tmp_path_factory.mktemp("wide-bert"), hidden_size=48)


def error_of(function) -> str:
    with pytest.raises(ValueError) as caught:
        function()
    return str(caught.value)


def test_a_model_list_parses_with_default_first() -> None:
    settings = Settings(models="legal=/models/legal, default=<bundled>,small=")
    assert settings.embedding_model_sources() == {"default": "", "legal": "/models/legal", "small": ""}
    assert settings.named_models
    single = Settings(model="/models/mine")
    assert single.embedding_model_sources() == {"default": "/models/mine"} and not single.named_models
    listed = Settings(model="/models/mine", models="legal=/models/legal")  # default from CLOZE_MODEL
    assert listed.embedding_model_sources() == {"default": "/models/mine", "legal": "/models/legal"}
    fill = Settings(fill_mask_models="mlm=/models/mlm")
    assert fill.fill_mask_model_sources() == {"default": "", "mlm": "/models/mlm"}


@pytest.mark.parametrize(
    ("models", "says"),
    [
        ("a/b=/x", "model name 'a/b'"),
        ("..=/x", "model name '..'"),
        ("a..b=/x", "no '..'"),
        ("nul\x00=/x", "model name 'nul\\x00'"),
        ("tab\there=/x", "model name"),
        ("lеgal=/x", "model name 'lеgal'"),  # a Cyrillic е: looks like legal, is not
        ("x" * 65 + "=/x", "65 characters, over 64"),
        ("legal=/x,Legal=/y", "'Legal' given twice"),
        ("legal", "not name=source"),
    ],
)
def test_a_bad_model_list_is_refused_naming_the_setting(models: str, says: str) -> None:
    message = error_of(lambda: Settings(models=models))
    assert "CLOZE_MODELS" in message and says in message
    assert "CLOZE_FILL_MASK_MODELS" in error_of(lambda: Settings(fill_mask_models=models))


def test_the_default_model_is_set_in_one_place_and_the_count_is_bounded() -> None:
    both = error_of(lambda: Settings(model="/models/a", models="default=/models/b"))
    assert "CLOZE_MODEL and CLOZE_MODELS both set the default model" in both
    too_many = error_of(lambda: Settings(models="a=/x,b=/y", fill_mask_models="c=/z", max_models=4))
    assert "5 models in all" in too_many and "CLOZE_MAX_MODELS=4" in too_many
    assert len(Settings(models="a=/x,b=/y", max_models=4).embedding_model_sources()) == 3  # + fill-mask


def test_a_toml_file_lists_models(tmp_path: Path) -> None:
    listing = tmp_path / "models.toml"
    listing.write_text('[models]\ndefault = "<bundled>"\nlegal = "/models/legal"\n')
    assert Settings(models=str(listing)).embedding_model_sources() == {
        "default": "",
        "legal": "/models/legal",
    }
    listing.write_text("[models]\nlegal = 3\n")
    assert "[models] table" in error_of(lambda: Settings(models=str(listing)))
    assert "cannot read" in error_of(lambda: Settings(models=str(tmp_path / "missing.toml")))


def test_cloze_serve_refuses_a_bad_model_list_before_it_listens() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", "9"],
        env={"PATH": "/usr/bin:/bin", "CLOZE_MODELS": "default=<bundled>,../etc=/x", "HF_HUB_OFFLINE": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "CLOZE_MODELS: model name '../etc'" in run.stderr, run.stderr[-2000:]


def test_a_request_finds_a_model_by_name_or_by_an_alias_only_one_model_has() -> None:
    registry = ModelRegistry.from_sources("embedding", {"default": "", "legal": "org/legal-model", "b": ""})
    assert registry.find(None).name == "default" and registry.find("legal").name == "legal"
    assert registry.find("org/legal-model").name == "legal"  # its source, a hub id
    statuses = {}
    for requested in ("nope", "org/other", "../../etc", "a\x00b", "x" * 300, "lеgal"):
        with pytest.raises(ApiError) as caught:
            registry.find(requested)
        assert caught.value.field == "model"
        statuses[requested] = caught.value.status
        if caught.value.status == 404:
            assert "served: default, legal, b" in caught.value.message
    assert statuses == {
        "nope": 404,
        "org/other": 404,
        "../../etc": 422,
        "a\x00b": 422,
        "x" * 300: 422,
        "lеgal": 422,
    }
    twice = ModelRegistry.from_sources("embedding", {"default": "org/m", "copy": "org/m"})
    with pytest.raises(ApiError, match="several models") as caught:
        twice.find("org/m")
    assert caught.value.status == 422


def serve(settings: Settings, scenario):
    """``scenario(client, app)`` against the app (its lane included), its models loaded on the scenario's loop."""
    app = create_app(settings)

    async def main():
        await load_engines(app.state.engines, app.state.lifecycle, settings, app.state.metrics)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                return await scenario(client, app)
        finally:
            await close_engines(app.state.engines, app.state.lifecycle)

    return asyncio.run(main())


def named(tiny_bert: Path, wide_bert: Path, tmp_path: Path, **more) -> Settings:
    return Settings(
        models=f"default={tiny_bert},wide={wide_bert},broken={tmp_path / 'no-such-model'}",
        fill_mask_model=str(tiny_bert),
        fill_mask_models=f"wide={wide_bert}",
        backend="torch",
        model_load_attempts=1,
        index=tmp_path / "index",
        max_models=6,
        **more,
    )


def test_each_model_answers_its_own_requests(tiny_bert: Path, wide_bert: Path, tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, app) -> None:
        listing = (await client.get("/models")).json()
        models = {entry["id"]: entry for entry in listing["models"]}
        assert list(models) == ["default", "wide", "broken"]
        assert (models["default"]["dimension"], models["wide"]["dimension"]) == (32, 48)
        assert models["default"]["fingerprint"] != models["wide"]["fingerprint"]
        assert models["wide"]["pooling"] == "mean" and models["wide"]["backend"] == "torch"
        assert models["wide"]["device"] == "cpu" and models["wide"]["status"] == "ready"
        assert models["wide"]["aliases"] == sorted({str(wide_bert), wide_bert.name})
        assert listing["embedding"]["dimension"] == 32 and listing["index_model"] == "default"
        assert [m["id"] for m in listing["fill_mask_models"]] == ["default", "wide"]

        def width(reply: httpx.Response) -> int:
            assert reply.status_code == 200, reply.text
            body = reply.json()  # /v1/embeddings: OpenAI's object; /embed: a list of vectors
            return len(body["data"][0]["embedding"]) if isinstance(body, dict) else len(body[0])

        openai = "/v1/embeddings"
        assert width(await client.post("/embed", json={"inputs": "the cat"})) == 32
        assert width(await client.post("/models/wide/embed", json={"inputs": "the cat"})) == 48
        assert width(await client.post("/models/default/embed", json={"inputs": "the cat"})) == 32
        assert width(await client.post(openai, json={"input": "the cat", "model": "wide"})) == 48
        assert width(await client.post(openai, json={"input": "the cat", "model": wide_bert.name})) == 48
        assert width(await client.post(openai, json={"input": "the cat"})) == 32
        wide = await client.post(
            openai, json={"input": ["the cat"], "model": "wide", "encoding_format": "float"}
        )
        direct = app.state.engines.models.slots["wide"].runtime.embed(["the cat"], normalize=None)
        assert np.allclose(wide.json()["data"][0]["embedding"], direct[0], atol=1e-5)  # the model's own norm

        pair = {"inputs": {"source_sentence": "the cat", "sentences": ["a dog", "the cat"]}}
        similarity = (await client.post("/models/wide/similarity", json=pair)).json()
        assert similarity[1] == pytest.approx(1, abs=1e-5) and similarity[0] < 0.999
        tokens = (await client.post("/models/wide/tokenize", json={"inputs": "the cat"})).json()
        ids = [token["id"] for token in tokens[0]]
        assert (await client.post("/models/wide/decode", json={"ids": ids})).json() == ["the cat"]
        fill = await client.post("/models/wide/fill-mask", json={"inputs": "the [MASK] sat"})
        default_fill = await client.post("/models/default/fill-mask", json={"inputs": "the [MASK] sat"})
        assert fill.status_code == default_fill.status_code == 200
        assert fill.json() != default_fill.json()  # other weights, other scores
        metrics = (await client.get("/metrics")).text
        assert 'cloze_batch_size_count{batcher="embed"} 3.0' in metrics  # a batcher per model
        assert 'cloze_batch_size_count{batcher="embed:wide"} 5.0' in metrics
        assert 'cloze_batch_size_count{batcher="fill-mask:wide"} 1.0' in metrics

    serve(named(tiny_bert, wide_bert, tmp_path), scenario)


def test_unknown_and_unloadable_models_are_refused_on_their_routes_only(
    tiny_bert: Path, wide_bert: Path, tmp_path: Path
) -> None:
    async def scenario(client: httpx.AsyncClient, app) -> None:
        unknown = await client.post("/v1/embeddings", json={"input": "a", "model": "nope"})
        assert unknown.status_code == 404 and unknown.json()["field"] == "model"
        assert "served: default, wide, broken" in unknown.json()["error"]
        assert (await client.post("/models/nope/embed", json={"inputs": "a"})).status_code == 404
        assert (await client.post("/models/nope/fill-mask", json={"inputs": "[MASK]"})).status_code == 404
        for bad in ("../../etc/passwd", "a\x00b", "x" * 300):
            refused = await client.post("/v1/embeddings", json={"input": "a", "model": bad})
            assert refused.status_code == 422 and refused.json()["field"] == "model", bad
        assert (await client.post("/models/a%00b/embed", json={"inputs": "a"})).json()["field"] == "model"

        broken = await client.post("/models/broken/embed", json={"inputs": "a"})
        assert broken.status_code == 503 and "'broken' unavailable" in broken.json()["error"]
        assert "retry-after" not in broken.headers  # every attempt failed
        assert (await client.post("/embed", json={"inputs": "a"})).status_code == 200
        assert (await client.get("/readyz")).json()["status"] == "ready"
        listing = {entry["id"]: entry for entry in (await client.get("/models")).json()["models"]}
        assert listing["broken"]["status"] == "failed" and "no-such-model" in listing["broken"]["error"]
        served = (await client.get("/v1/models")).json()
        assert [entry["id"] for entry in served["data"]] == ["default", "wide"]  # loaded ones

    serve(named(tiny_bert, wide_bert, tmp_path), scenario)


def test_without_a_model_list_any_model_string_reaches_the_one_model(tiny_bert: Path, tmp_path: Path) -> None:
    """Before named models every ``model`` reached the one model; a service configured as then still does."""
    settings = Settings(
        model=str(tiny_bert), fill_mask_model=str(tiny_bert), backend="torch", index=tmp_path / "index"
    )

    async def scenario(client: httpx.AsyncClient, app) -> None:
        for model in ("anything", "text-embedding-3-small", "default"):
            reply = await client.post("/v1/embeddings", json={"input": "a", "model": model})
            assert reply.status_code == 200 and len(reply.json()["data"][0]["embedding"]) == 32
        assert (await client.post("/models/other/embed", json={"inputs": "a"})).status_code == 404
        assert [m["id"] for m in (await client.get("/models")).json()["models"]] == ["default"]

    serve(settings, scenario)


def test_a_model_that_appears_late_is_loaded_by_a_retry(
    tiny_bert: Path, wide_bert: Path, tmp_path: Path
) -> None:
    """A model folder on a volume still mounting: the first try fails, a retry loads it, the routes follow."""
    late = tmp_path / "late"
    settings = Settings(
        models=f"default={tiny_bert},late={late}",
        fill_mask_model=str(tiny_bert),
        backend="torch",
        model_load_attempts=2,
        index=tmp_path / "index",
    )
    app = create_app(settings)

    async def main() -> tuple[int, int, int]:
        engines = app.state.engines
        loading = asyncio.create_task(load_engines(engines, app.state.lifecycle, settings, app.state.metrics))
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                while engines.collections.default.index is None:  # the first round of loads is over
                    await asyncio.sleep(0.05)
                before = (await client.post("/models/late/embed", json={"inputs": "a"})).status_code
                shutil.copytree(wide_bert, late)
                await asyncio.wait_for(loading, 60)  # one retry, about 2 s later
                after = await client.post("/models/late/embed", json={"inputs": "a"})
                return before, after.status_code, len(after.json()[0])
        finally:
            loading.cancel()
            await close_engines(app.state.engines, app.state.lifecycle)

    assert asyncio.run(main()) == (503, 200, 48)
