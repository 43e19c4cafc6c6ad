"""Embeddings and fill-mask over a real socket; the official openai client against /v1/embeddings."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from tests.e2e.conftest import READ_KEY


@pytest.fixture(scope="module")
def reference(bundled_torch):
    return bundled_torch


def test_health_and_models(client):
    assert client.get("/healthz").json() == {"status": "ok", "ready": True}
    models = client.get("/models").json()
    assert models["embedding"]["dimension"] == 384
    assert models["embedding"]["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert models["embedding"]["backend"] == "onnx-int8"  # auto on a CPU
    assert models["embedding"]["provider"] == "CPUExecutionProvider"
    assert models["fill_mask"]["mask_token"] == "[MASK]"


def test_openai_client_works_unchanged(server, reference):
    api = openai.OpenAI(base_url=server + "/v1", api_key=READ_KEY)
    texts = ["A man is playing a guitar.", "The stock market fell sharply today."]
    response = api.embeddings.create(model="anything", input=texts)  # the client asks for base64 by default
    got = np.array([item.embedding for item in response.data], dtype=np.float32)
    assert got.shape == (2, 384) and [item.index for item in response.data] == [0, 1]
    assert (got * reference.embed(texts)).sum(axis=1).min() > 0.98  # int8 service vs fp32 torch
    assert response.usage.prompt_tokens > 10 and response.model == "sentence-transformers/all-MiniLM-L6-v2"
    floats = api.embeddings.create(model="x", input="hello world", encoding_format="float", dimensions=64)
    vector = np.array(floats.data[0].embedding)
    assert vector.shape == (64,) and abs(np.linalg.norm(vector) - 1) < 1e-4


def test_tei_embed_shape_and_truncation_rule(client):
    vectors = client.post("/embed", json={"inputs": ["one", "two"], "normalize": True}).json()
    assert np.array(vectors).shape == (2, 384)
    too_long = client.post("/embed", json={"inputs": ["word " * 400]})
    assert too_long.status_code == 422 and too_long.json()["field"] == "inputs[0]"
    truncated = client.post("/embed", json={"inputs": ["short", "word " * 400], "truncate": True})
    assert truncated.status_code == 200 and truncated.headers["x-truncated-inputs"] == "1"
    openai_style = client.post("/v1/embeddings", json={"input": ["word " * 400, "short"]})
    assert openai_style.status_code == 200 and openai_style.headers["x-truncated-inputs"] == "0"


def test_fill_mask_shape_and_errors(client):
    body = {"inputs": ["the cat [MASK] on the [MASK] ."], "parameters": {"top_k": 3}}
    answer = client.post("/fill-mask", json=body).json()  # one input, two masks: a list per mask
    assert len(answer) == 2 and len(answer[0]) == 3
    assert set(answer[0][0]) == {"score", "token", "token_str", "sequence"}
    no_mask = client.post("/fill-mask", json={"inputs": "no mask here"})
    assert no_mask.status_code == 422 and "[MASK]" in no_mask.json()["error"]
    zero = client.post("/fill-mask", json={"inputs": "a [MASK]", "parameters": {"top_k": 0}})
    assert zero.json()["field"] == "parameters.top_k"
    assert (
        client.post("/fill-mask", json={"inputs": "a [MASK]", "parameters": {"top_k": 51}}).status_code == 422
    )
    past_window = client.post("/fill-mask", json={"inputs": "the cat sat " * 40 + "[MASK] ."})
    assert past_window.status_code == 422 and "window" in past_window.json()["error"]
