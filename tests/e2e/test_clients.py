"""The clients people already use, unchanged, against the real server on a socket.

``openai`` on /v1/embeddings; ``huggingface_hub.InferenceClient`` (feature_extraction on /embed, fill_mask on
/fill-mask, sentence_similarity on /similarity); TEI's /tokenize and /decode. The fill-mask answers are
compared with transformers' own fill-mask pipeline over the same (tiny) model the server runs."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
from huggingface_hub import InferenceClient, constants
from huggingface_hub.errors import HfHubHTTPError

from tests.e2e.conftest import READ_KEY

SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell sharply."]


@pytest.fixture
def hf(monkeypatch, server):
    """``InferenceClient`` for a route of the server. Offline mode (set for the whole suite) makes the client
    refuse every URL, 127.0.0.1 included, so it is lifted here, with the Hub and the inference router pointed
    at a closed local port: nothing can leave the machine."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "INFERENCE_PROXY_TEMPLATE", "http://127.0.0.1:9/{provider}")
    return lambda route, token=READ_KEY: InferenceClient(model=server + route, token=token, timeout=60)


@pytest.fixture(scope="module")
def pipeline(tiny_bert):
    """The reference: transformers' FillMaskPipeline over the model the e2e server fills masks with."""
    from transformers import pipeline

    return pipeline("fill-mask", model=str(tiny_bert), device="cpu")


def same_answer(ours, theirs) -> None:
    """Equal nesting, keys, tokens and sequences; scores within float tolerance."""
    assert type(ours) is type(theirs) or (isinstance(ours, float) and isinstance(theirs, float))
    if isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            same_answer(a, b)
    elif isinstance(theirs, dict):
        assert set(ours) == set(theirs)
        assert ours["score"] == pytest.approx(theirs["score"], abs=1e-5)
        assert (ours["token"], ours["token_str"], ours["sequence"]) == (
            theirs["token"],
            theirs["token_str"],
            theirs["sequence"],
        )


def test_openai_client_float_base64_and_dimensions(server, bundled_torch):
    api = openai.OpenAI(base_url=server + "/v1", api_key=READ_KEY)
    default = api.embeddings.create(model="any", input=SENTENCES)  # the client asks for base64 by default
    floats = api.embeddings.create(model="any", input=SENTENCES, encoding_format="float")
    got = np.array([item.embedding for item in default.data], dtype=np.float32)
    assert got.shape == (3, 384) and [item.index for item in default.data] == [0, 1, 2]
    assert np.allclose(got, np.array([item.embedding for item in floats.data]), atol=1e-6)
    assert (got * bundled_torch.embed(SENTENCES)).sum(axis=1).min() > 0.98  # int8 service vs fp32 torch
    short = api.embeddings.create(model="any", input=SENTENCES[0], encoding_format="float", dimensions=64)
    vector = np.array(short.data[0].embedding)
    assert vector.shape == (64,) and np.linalg.norm(vector) == pytest.approx(1, abs=1e-4)
    assert (
        float(vector @ (got[0, :64] / np.linalg.norm(got[0, :64]))) > 0.9999
    )  # the leading 64, renormalised
    raw = httpx.post(
        server + "/v1/embeddings",
        json={"input": SENTENCES[0], "encoding_format": "base64", "dimensions": 8},
        headers={"Authorization": f"Bearer {READ_KEY}"},
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert decoded.shape == (8,) and raw["usage"]["prompt_tokens"] == raw["usage"]["total_tokens"] > 0
    with pytest.raises(openai.UnprocessableEntityError):
        api.embeddings.create(model="any", input="x", encoding_format="float", dimensions=385)


def test_hf_feature_extraction_with_tei_options(hf, bundled_torch):
    client = hf("/embed")
    one = client.feature_extraction(SENTENCES[0])
    assert one.shape == (1, 384) and one.dtype == np.float32  # TEI: always a list of vectors
    many = client.feature_extraction(SENTENCES)
    assert many.shape == (3, 384) and np.allclose(many[0], one[0], atol=1e-6)
    assert (many * bundled_torch.embed(SENTENCES)).sum(axis=1).min() > 0.98
    assert np.allclose(np.linalg.norm(many, axis=1), 1, atol=1e-4)
    raw = client.feature_extraction(SENTENCES, normalize=False)
    assert np.linalg.norm(raw, axis=1).min() > 1.5  # MiniLM's mean-pooled vectors are far from unit length
    assert np.allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), many, atol=1e-5)
    short = client.feature_extraction(SENTENCES[0], dimensions=32)
    assert short.shape == (1, 32) and np.linalg.norm(short) == pytest.approx(1, abs=1e-4)
    long_text = "word " * 400
    with pytest.raises(HfHubHTTPError, match="422"):
        client.feature_extraction(long_text)  # TEI refuses inputs over the window unless told to truncate
    assert client.feature_extraction(long_text, truncate=True).shape == (1, 384)
    with pytest.raises(HfHubHTTPError, match="422"):
        client.feature_extraction("x", truncation_direction="left")
    with pytest.raises(HfHubHTTPError, match="401"):
        hf("/embed", token=None).feature_extraction("x")


def test_hf_fill_mask_with_top_k_and_targets_matches_the_pipeline(hf, pipeline):
    client = hf("/fill-mask")
    sentence = "the cat [MASK] on the mat ."
    answer = client.fill_mask(sentence, top_k=3)
    assert len(answer) == 3 and answer[0].score >= answer[1].score >= answer[2].score
    same_answer(_plain(answer), pipeline(sentence, top_k=3))
    targeted = client.fill_mask(sentence, targets=["sat", "dog", "paris"], top_k=2)
    same_answer(_plain(targeted), pipeline(sentence, targets=["sat", "dog", "paris"], top_k=2))
    assert {p.token_str for p in targeted} <= {"sat", "dog", "paris"}


def _plain(elements) -> list[dict]:
    return [
        {"score": e.score, "token": e.token, "token_str": e.token_str, "sequence": e.sequence}
        for e in elements
    ]


@pytest.mark.parametrize(
    "inputs",
    [
        "the cat [MASK] on the mat .",  # one input, one mask: a flat list
        "the [MASK] sat on the [MASK] .",  # several masks: a list per mask
        ["the cat [MASK] on the mat ."],  # a list of one is answered as that one
        ["the cat [MASK] on the mat .", "the dog [MASK] in paris ."],  # several inputs: a list per input
        ["the cat [MASK] on the mat .", "the [MASK] sat on the [MASK] ."],  # mixed, as the pipeline mixes
    ],
)
def test_fill_mask_nests_as_the_pipeline_does(client, pipeline, inputs):
    answer = client.post("/fill-mask", json={"inputs": inputs, "parameters": {"top_k": 2}})
    assert answer.status_code == 200, answer.text
    same_answer(answer.json(), pipeline(inputs, top_k=2))
    nested = client.post(
        "/fill-mask", json={"inputs": inputs, "parameters": {"top_k": 2}, "nested": True}
    ).json()
    texts = [inputs] if isinstance(inputs, str) else inputs
    assert len(nested) == len(texts)
    for text, per_mask in zip(texts, nested, strict=True):
        assert len(per_mask) == text.count("[MASK]") and all(len(p) == 2 for p in per_mask)


def test_fill_mask_refuses_the_old_top_level_options(client):
    old = client.post("/fill-mask", json={"inputs": "a [MASK]", "top_k": 3})
    assert old.status_code == 422 and "parameters.top_k" in old.json()["error"]
    bad_k = client.post("/fill-mask", json={"inputs": "a [MASK]", "parameters": {"top_k": 0}})
    assert bad_k.status_code == 422 and bad_k.json()["field"] == "parameters.top_k"


def test_hf_sentence_similarity(hf, bundled_torch):
    scores = hf("/similarity").sentence_similarity(SENTENCES[0], other_sentences=SENTENCES[1:])
    reference = bundled_torch.embed(SENTENCES)
    assert len(scores) == 2 and scores[0] > scores[1]
    assert scores == pytest.approx((reference[1:] @ reference[0]).tolist(), abs=0.02)  # int8 vs fp32


def test_similarity_limits_and_truncation(client, server_env):
    limit = int(server_env["CLOZE_MAX_INPUTS"])
    source = {"source_sentence": "a"}
    too_many = client.post("/similarity", json={"inputs": {**source, "sentences": ["b"] * limit}})
    assert too_many.status_code == 422 and too_many.json()["field"] == "inputs.sentences"
    long_one = {"inputs": {**source, "sentences": ["b", "word " * 400]}}
    refused = client.post("/similarity", json=long_one)
    assert refused.status_code == 422 and refused.json()["field"] == "inputs.sentences[1]"
    cut = client.post("/similarity", json={**long_one, "parameters": {"truncate": True}})
    assert cut.status_code == 200 and len(cut.json()) == 2 and cut.headers["x-truncated-inputs"] == "2"
    assert httpx.post(str(client.base_url) + "/similarity", json=long_one).status_code == 401


def test_tei_tokenize_and_decode(client, bundled_torch):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_torch.info.path)
    text = "Hello wörld, tokenizers!"
    [tokens] = client.post("/tokenize", json={"inputs": text}).json()  # TEI: always a list per input
    assert [t["id"] for t in tokens] == tokenizer(text)["input_ids"]
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[1] == {"id": tokenizer.convert_tokens_to_ids("hello"), "text": "Hello", "special": False,
                         "start": 0, "stop": 5}  # fmt: skip
    assert all(text[t["start"] : t["stop"]] == t["text"] for t in tokens if not t["special"])
    plain = client.post("/tokenize", json={"inputs": [text, "b"], "add_special_tokens": False}).json()
    assert len(plain) == 2 and not any(t["special"] for t in plain[0]) and len(plain[0]) == len(tokens) - 2
    long_text = "word " * 400  # no truncation here: every token is listed
    assert len(client.post("/tokenize", json={"inputs": long_text}).json()[0]) == 402

    ids = [t["id"] for t in tokens]
    assert client.post("/decode", json={"ids": ids}).json() == [
        tokenizer.decode(ids, skip_special_tokens=True)
    ]
    both = client.post("/decode", json={"ids": [ids, ids[:3]], "skip_special_tokens": False}).json()
    assert both == [tokenizer.decode(ids), tokenizer.decode(ids[:3])]
    out_of_range = client.post("/decode", json={"ids": [[101], [99999999]]})
    assert out_of_range.status_code == 422 and out_of_range.json()["field"] == "ids[1]"
    assert client.post("/decode", json={"ids": []}).status_code == 422
    assert client.post("/tokenize", json={"inputs": "x" * 5001}).status_code == 422  # CLOZE_MAX_CHARS
    assert client.post("/tokenize", json={"inputs": ["x"] * 65}).status_code == 422  # CLOZE_MAX_INPUTS
