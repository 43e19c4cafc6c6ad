"""Rerankers as named models: settings, the registry's default, access, and the 429 of a full queue."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from app.service.errors import ApiError
from app.service.model_registry import ModelRegistry
from app.settings import Settings
from tests.app.test_named_models import error_of, serve


def test_rerankers_are_listed_by_name_and_counted_with_the_other_models() -> None:
    settings = Settings(rerank_models="legal=/m/legal,web=/m/web")
    assert settings.rerank_model_sources() == {"legal": "/m/legal", "web": "/m/web"}
    assert Settings().rerank_model_sources() == {}  # none unless configured
    assert "needs a cross-encoder folder" in error_of(lambda: Settings(rerank_models="a=<bundled>"))
    too_many = error_of(lambda: Settings(models="a=/x", rerank_models="r=/r,s=/s", max_models=4))
    assert "CLOZE_RERANK_MODELS" in too_many and "5 models" in too_many


def test_a_request_without_model_gets_default_if_listed_else_the_first() -> None:
    def registry(names: list[str]) -> ModelRegistry:
        return ModelRegistry.from_sources("rerank", {n: f"/m/{n}" for n in names}, bundled_default=False)

    assert registry(["legal", "web"]).find(None).name == "legal"
    assert registry(["legal", "default"]).find(None).name == "default"
    with pytest.raises(ApiError) as none:
        registry([]).find(None)
    assert none.value.status == 404 and "CLOZE_RERANK_MODELS" in none.value.message
    with pytest.raises(ApiError) as unknown:
        registry(["legal"]).find("rerank-v3.5")
    assert unknown.value.status == 404 and "served: legal" in unknown.value.message


def test_a_full_reranker_queue_answers_429_with_retry_after(
    tiny_bert: Path, tiny_cross_encoder: Path, tmp_path
):
    """The embedding runtime's policy: a bounded queue, and 429 with Retry-After past it (never a wait)."""
    settings = Settings(
        model=str(tiny_bert),
        fill_mask_model=str(tiny_bert),
        rerank_models=f"tiny={tiny_cross_encoder}",
        backend="torch",
        index=tmp_path / "index",
        max_queue=3,
        model_load_attempts=1,
    )

    async def scenario(client: httpx.AsyncClient, app) -> None:
        batcher = app.state.engines.rerankers.slots["tiny"].batcher
        run = batcher._run

        def slow(items):  # holds the first request's pairs in the queue while the second arrives
            time.sleep(0.5)
            return run(items)

        batcher._run = slow
        body = {"query": "the cat", "texts": ["the dog sat", "the mat"]}
        first, second = await asyncio.gather(
            client.post("/rerank", json=body), client.post("/rerank", json=body)
        )
        statuses = sorted([first.status_code, second.status_code])
        assert statuses == [200, 429], (first.text, second.text)
        refused = first if first.status_code == 429 else second
        assert refused.headers["Retry-After"] == "1" and "queued" in refused.json()["error"]
        never = await client.post("/rerank", json={"query": "the cat", "texts": ["a"] * 4})
        assert never.status_code == 422 and "queue" in never.json()["error"]  # could never be admitted
        metrics = (await client.get("/metrics")).text
        assert 'cloze_batch_size_count{batcher="rerank:tiny"}' in metrics

    serve(settings, scenario)
