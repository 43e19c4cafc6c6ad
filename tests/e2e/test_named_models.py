"""Two embedding models served at once by a real server on a socket (issue 44): the bundled MiniLM (384-d) as
``default`` and the tiny random model (32-d) as ``tiny``, so a vector's length says which model answered.
The real ``openai`` client picks one with ``model=``; ``huggingface_hub.InferenceClient`` reaches one at
``/models/{name}/embed``, as it reaches a model on Hugging Face's router by its URL."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from huggingface_hub import InferenceClient, constants

from tests.e2e.conftest import READ_KEY, WRITE_KEY, running_server

BUNDLED_ID = "sentence-transformers/all-MiniLM-L6-v2"
SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell sharply."]


@pytest.fixture(scope="module")
def two_models(tiny_bert, tmp_path_factory) -> Iterator[str]:
    env = {
        "CLOZE_INDEX": str(tmp_path_factory.mktemp("named-index") / "idx"),
        "CLOZE_MODELS": f"default=<bundled>,tiny={tiny_bert}",
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_BACKEND": "torch",  # no ONNX export of the tiny model at start: this is about the mechanics
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_READ_API_KEYS": READ_KEY,
    }
    with running_server(env, tmp_path_factory.mktemp("named-logs") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def http(two_models) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {READ_KEY}"}
    with httpx.Client(base_url=two_models, headers=headers, timeout=60) as client:
        yield client


def test_get_models_lists_every_model_served(http, two_models):
    listing = http.get("/models").json()
    models = {entry["id"]: entry for entry in listing["models"]}
    assert list(models) == ["default", "tiny"] and listing["index_model"] == "default"
    assert (models["default"]["dimension"], models["tiny"]["dimension"]) == (384, 32)
    assert models["default"]["model_id"] == BUNDLED_ID and BUNDLED_ID in models["default"]["aliases"]
    assert models["default"]["fingerprint"] != models["tiny"]["fingerprint"]
    for entry in models.values():
        assert entry["status"] == "ready" and entry["backend"] == "torch" and entry["device"] == "cpu"
        assert entry["pooling"] == "mean" and len(entry["fingerprint"]) >= 16
    assert listing["embedding"]["model_id"] == BUNDLED_ID  # the default model, where it always was
    api = openai.OpenAI(base_url=two_models + "/v1", api_key=READ_KEY)
    assert [model.id for model in api.models.list()] == ["default", "tiny"]


def test_the_openai_client_chooses_the_model(two_models, bundled_torch):
    api = openai.OpenAI(base_url=two_models + "/v1", api_key=READ_KEY)
    tiny = api.embeddings.create(model="tiny", input=SENTENCES)
    assert np.array([item.embedding for item in tiny.data]).shape == (3, 32)
    for name in ("default", BUNDLED_ID):  # a model answers to its name and to its model id
        default = api.embeddings.create(model=name, input=SENTENCES)
        got = np.array([item.embedding for item in default.data], dtype=np.float32)
        assert got.shape == (3, 384) and default.model == BUNDLED_ID
        assert (got * bundled_torch.embed(SENTENCES)).sum(axis=1).min() > 0.999  # torch here and there
    with pytest.raises(openai.NotFoundError) as unknown:
        api.embeddings.create(model="text-embedding-3-small", input="x")
    error = unknown.value.response.json()
    assert error["field"] == "model" and "served: default, tiny" in error["error"]
    with pytest.raises(openai.UnprocessableEntityError):
        api.embeddings.create(model="../../etc/passwd", input="x")


def test_tei_routes_reach_a_named_model_by_its_path(http, two_models, monkeypatch):
    # As tests/e2e/test_clients.py: the client may reach 127.0.0.1, and the Hub only a closed local port.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "INFERENCE_PROXY_TEMPLATE", "http://127.0.0.1:9/{provider}")

    def client(route: str) -> InferenceClient:
        return InferenceClient(model=two_models + route, token=READ_KEY, timeout=60)

    assert client("/models/tiny/embed").feature_extraction(SENTENCES).shape == (3, 32)
    assert client("/models/default/embed").feature_extraction(SENTENCES).shape == (3, 384)
    assert client("/embed").feature_extraction(SENTENCES[0]).shape == (1, 384)  # the plain route: default
    tiny_scores = client("/models/tiny/similarity").sentence_similarity(SENTENCES[0], SENTENCES[1:])
    default_scores = client("/similarity").sentence_similarity(SENTENCES[0], SENTENCES[1:])
    assert len(tiny_scores) == 2 and tiny_scores != pytest.approx(default_scores, abs=1e-3)

    [tiny_tokens] = http.post("/models/tiny/tokenize", json={"inputs": "the cat sat"}).json()
    [bundled_tokens] = http.post("/tokenize", json={"inputs": "the cat sat"}).json()
    assert [t["text"] for t in tiny_tokens] == [t["text"] for t in bundled_tokens]  # same words...
    assert [t["id"] for t in tiny_tokens] != [t["id"] for t in bundled_tokens]  # ...other vocabularies
    unknown = http.post("/models/nope/embed", json={"inputs": "x"})
    assert unknown.status_code == 404 and "served: default, tiny" in unknown.json()["error"]
    assert httpx.post(two_models + "/models/tiny/embed", json={"inputs": "x"}).status_code == 401


def test_each_model_batches_on_its_own(http):
    metrics = http.get("/metrics").text
    assert 'cloze_queue_depth{batcher="embed"}' in metrics
    assert 'cloze_queue_depth{batcher="embed:tiny"}' in metrics
