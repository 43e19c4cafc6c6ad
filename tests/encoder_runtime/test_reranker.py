"""The cross-encoder runtime: pairs cut on the document side, batched == one-by-one, backends agree."""

from __future__ import annotations

import numpy as np
import pytest

from encoder_runtime import RerankPair, load_reranker, sigmoid
from harness.rerankers import judged_triples

QUERY = "the cat sat on the mat"
DOCUMENTS = [
    "the dog sat on the mat .",
    "paris is the capital of france",
    "a long sentence of words , " * 12,  # past the tiny model's 64-token window with the query
    "the king read a book",
    "music",
]


@pytest.fixture(scope="module")
def tiny_torch(tiny_cross_encoder):
    return load_reranker(tiny_cross_encoder, backend="torch")


@pytest.fixture(scope="module")
def small_torch(small_reranker):
    return load_reranker(small_reranker, backend="torch")


def test_pairs_are_cut_on_the_document_side(tiny_torch):
    tokenizer = tiny_torch.tokenizer
    query_ids = tokenizer.encode([RerankPair(QUERY, "")])[0].ids[
        :-1
    ]  # [CLS] query [SEP], then the empty doc's [SEP]
    short, long = tokenizer.encode([RerankPair(QUERY, DOCUMENTS[0]), RerankPair(QUERY, DOCUMENTS[2])])
    assert not short.truncated and long.truncated
    assert len(long) == tiny_torch.max_tokens == 64
    for item in (short, long):
        assert item.ids[: len(query_ids)] == query_ids  # the whole query, whatever the document's length
        assert item.type_ids == (0,) * len(query_ids) + (1,) * (len(item) - len(query_ids))
    assert long.ids[-1] == tokenizer.hf.sep_token_id


def test_a_query_longer_than_half_the_window_is_cut_and_the_document_keeps_the_rest(tiny_torch):
    long_query = "the cat sat on the mat " * 20
    [item] = tiny_torch.encode([RerankPair(long_query, "the dog read a book")])
    assert item.truncated and len(item) <= tiny_torch.max_tokens
    documents = item.type_ids.count(1)
    assert documents >= tiny_torch.max_tokens // 2 - 3 or documents == len("the dog read a book".split()) + 1


def test_a_pairs_segment_ids_are_padded_into_the_inputs(tiny_torch):
    """The document's tokens carry segment 1 into the model's inputs, not the zeros single texts get."""
    pair = tiny_torch.encode([RerankPair("the cat", "the dog")])[0]
    inputs = tiny_torch.tokenizer.pad([pair])
    assert inputs["token_type_ids"].sum() > 0


def test_batched_scores_equal_one_by_one(small_torch):
    """As TEI's test_bert.rs asserts for embeddings: a pair's score does not depend on its batch."""
    queries, documents = zip(*[(q, d) for q, good, bad in judged_triples() for d in (good, bad)], strict=True)
    pairs = [RerankPair(q, d) for q, d in zip(queries, documents, strict=True)]
    batched = small_torch.score_encoded(small_torch.encode(pairs))
    alone = np.array([small_torch.score(p.query, [p.document])[0] for p in pairs])
    np.testing.assert_allclose(batched, alone, atol=1e-5)
    assert batched.dtype == np.float32 and batched.shape == (len(pairs),)


@pytest.mark.parametrize("backend", ["torch", "onnx", "onnx-int8"])
def test_every_backend_scores_batched_as_one_by_one(tiny_cross_encoder, backend, tmp_path_factory):
    runtime = load_reranker(
        tiny_cross_encoder, backend=backend, onnx_cache=tmp_path_factory.getbasetemp() / "tiny-rerank-onnx"
    )
    batched = runtime.score(QUERY, DOCUMENTS)
    alone = np.array([runtime.score(QUERY, [d])[0] for d in DOCUMENTS])
    np.testing.assert_allclose(batched, alone, atol=1e-5)
    assert runtime.backend.name == backend


def test_onnx_fp32_and_int8_agree_with_torch_on_the_tiny_model(
    tiny_cross_encoder, tiny_torch, tmp_path_factory
):
    cache = tmp_path_factory.getbasetemp() / "tiny-rerank-onnx"
    expected = tiny_torch.score(QUERY, DOCUMENTS)
    fp32 = load_reranker(tiny_cross_encoder, backend="onnx", onnx_cache=cache).score(QUERY, DOCUMENTS)
    int8 = load_reranker(tiny_cross_encoder, backend="onnx-int8", onnx_cache=cache).score(QUERY, DOCUMENTS)
    np.testing.assert_allclose(fp32, expected, atol=1e-4)
    assert np.abs(sigmoid(int8) - sigmoid(expected)).max() < 0.05
    assert (cache / "rerank.json").is_file() and (cache / "rerank_int8.onnx").is_file()


def test_the_runtime_scores_as_sentence_transformers_cross_encoder_does(small_reranker, small_torch):
    import torch
    from sentence_transformers import CrossEncoder

    triples = judged_triples()
    pairs = [(q, d) for q, good, bad in triples for d in (good, bad)]
    reference = CrossEncoder(str(small_reranker), device="cpu").predict(
        pairs, activation_fn=torch.nn.Identity()
    )
    ours = np.concatenate([small_torch.score(q, [good, bad]) for q, good, bad in triples])
    np.testing.assert_allclose(ours, reference, atol=1e-4)


def test_the_trained_reranker_puts_each_judged_passage_first(small_torch):
    for query, good, bad in judged_triples():
        relevant, other = sigmoid(small_torch.score(query, [good, bad]))
        assert relevant > 0.5 > other, query


@pytest.mark.slow  # whole-model exports: make test, not test-fast
def test_onnx_fp32_and_int8_keep_the_trained_rerankers_order(small_reranker, small_torch):
    triples = judged_triples()
    expected = np.concatenate([small_torch.score(q, [g, b]) for q, g, b in triples])
    for backend, tolerance in (("onnx", 1e-3), ("onnx-int8", 0.05)):
        runtime = load_reranker(small_reranker, backend=backend)
        got = np.concatenate([runtime.score(q, [g, b]) for q, g, b in triples])
        assert np.abs(sigmoid(got) - sigmoid(expected)).max() < tolerance, backend
        assert (got[0::2] > got[1::2]).all(), backend


def test_a_folder_that_is_no_cross_encoder_is_refused(tiny_bert, tmp_path):
    from sentence_transformers import CrossEncoder

    with pytest.raises(ValueError, match="not a cross-encoder"):
        load_reranker(tiny_bert, backend="torch")
    CrossEncoder(str(tiny_bert), num_labels=2, device="cpu").save(str(tmp_path / "two-labels"))
    with pytest.raises(ValueError, match="2 labels per pair"):
        load_reranker(tmp_path / "two-labels", backend="torch")
