"""Reranking over a real server on a socket (issue 48): the real ``cohere`` SDK's v1 and v2 clients pointed at
the service's base URL, plain HTTP for TEI's ``/rerank``, and search's ``rerank`` option in every mode.

``default`` is the bundled MiniLM trained as a cross-encoder on a handful of judged pairs (harness.rerankers),
so its order is known for those queries; ``tiny`` is a random one with a 64-token window, for truncation."""

from __future__ import annotations

from collections.abc import Iterator

import cohere
import httpx
import numpy as np
import pytest

from cloze_search import Client, Rerank
from cloze_search.langchain import ClozeVectorStore
from encoder_runtime import sigmoid
from harness.rerankers import JUDGED, judged_triples
from tests.e2e.conftest import READ_KEY, WRITE_KEY, running_server

QUERY, RELEVANT = JUDGED[0]
DOCUMENTS = [JUDGED[3][1], RELEVANT, JUDGED[5][1]]  # the relevant one in the middle


@pytest.fixture(scope="module")
def rerank_server(small_reranker, tiny_cross_encoder, tmp_path_factory) -> Iterator[str]:
    env = {
        "CLOZE_INDEX": str(tmp_path_factory.mktemp("rerank-index") / "idx"),
        "CLOZE_RERANK_MODELS": f"default={small_reranker},tiny={tiny_cross_encoder}",
        "CLOZE_BACKEND": "torch",  # no ONNX exports at start: the runtime's tests compare the backends
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_READ_API_KEYS": READ_KEY,
        "CLOZE_MAX_INPUTS": "16",
        "CLOZE_MAX_CHARS": "2000",
        "CLOZE_MAX_RERANK_CANDIDATES": "20",
    }
    with running_server(env, tmp_path_factory.mktemp("rerank-logs") / "server.log") as url:
        documents = [{"id": f"d{i}", "text": passage} for i, (_, passage) in enumerate(JUDGED)]
        headers = {"Authorization": f"Bearer {WRITE_KEY}"}
        assert httpx.put(url + "/documents", json=documents, headers=headers, timeout=60).status_code == 200
        yield url


@pytest.fixture(scope="module")
def http(rerank_server) -> Iterator[httpx.Client]:
    """A read key: reranking reads."""
    with httpx.Client(
        base_url=rerank_server, headers={"Authorization": f"Bearer {READ_KEY}"}, timeout=60
    ) as c:
        yield c


def test_tei_rerank_answers_best_first_with_sigmoid_or_raw_scores(http):
    reply = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert reply.status_code == 200, reply.text
    results = reply.json()
    assert [r["index"] for r in results][0] == 1 and sorted(r["index"] for r in results) == [0, 1, 2]
    assert results[0]["text"] == RELEVANT
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores) and scores[0] > 0.5
    raw = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}).json()
    assert [r["index"] for r in raw] == [r["index"] for r in results] and "text" not in raw[0]
    np.testing.assert_allclose(sigmoid(np.array([r["score"] for r in raw])), scores, atol=1e-6)


def test_tei_rerank_refuses_a_pair_over_the_window_unless_truncate(http):
    long_text = "a long sentence of words , " * 20
    body = {"query": "the cat", "texts": ["the dog sat", long_text]}
    refused = http.post("/models/tiny/rerank", json=body)
    assert refused.status_code == 422 and refused.json()["field"] == "texts[1]"
    assert "64 tokens" in refused.json()["error"] and "truncate=true" in refused.json()["error"]
    cut = http.post("/models/tiny/rerank", json=body | {"truncate": True})
    assert cut.status_code == 200 and cut.headers["X-Truncated-Inputs"] == "1"
    left = http.post("/rerank", json=body | {"truncate": True, "truncation_direction": "Left"})
    assert left.status_code == 422 and left.json()["field"] == "truncation_direction"


def test_the_cohere_v1_client_reranks_here(rerank_server):
    client = cohere.Client(base_url=rerank_server, api_key=READ_KEY)
    response = client.rerank(query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True)
    assert [r.index for r in response.results][0] == 1 and len(response.results) == 2
    assert response.results[0].document.text == RELEVANT
    assert 0.5 < response.results[0].relevance_score <= 1 and response.id and response.meta is not None
    # v1 documents may be objects: ``text`` is scored, the rest comes back as sent
    objects = [{"text": text, "source": f"s{i}"} for i, text in enumerate(DOCUMENTS)]
    best = client.rerank(model="default", query=QUERY, documents=objects, top_n=1, return_documents=True)
    assert best.results[0].index == 1 and best.results[0].document.source == "s1"


def test_the_cohere_v2_client_reranks_here_and_names_the_served_models(rerank_server):
    client = cohere.ClientV2(base_url=rerank_server, api_key=READ_KEY)
    response = client.rerank(model="default", query=QUERY, documents=DOCUMENTS)
    assert [r.index for r in response.results][0] == 1 and len(response.results) == 3
    scores = [r.relevance_score for r in response.results]
    assert scores == sorted(scores, reverse=True)
    for query, good, bad in judged_triples():  # the trained order, through the SDK
        assert (
            client.rerank(model="default", query=query, documents=[bad, good], top_n=1).results[0].index == 1
        )
    with pytest.raises(cohere.errors.NotFoundError) as missing:
        client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCUMENTS)
    assert "served: default, tiny" in missing.value.body["error"]


def test_rerank_requests_are_bounded_with_clear_messages(http, rerank_server):
    too_many = http.post("/rerank", json={"query": QUERY, "texts": ["a"] * 17})
    assert too_many.status_code == 422 and "limit of 16" in too_many.json()["error"]
    too_long = http.post(
        "/v2/rerank", json={"model": "default", "query": QUERY, "documents": ["a", "b" * 2001]}
    )
    assert too_long.status_code == 422 and too_long.json()["field"] == "documents[1]"
    empty = http.post("/rerank", json={"query": " ", "texts": ["a"]})
    assert empty.status_code == 422 and empty.json()["field"] == "query"
    fields = http.post("/v1/rerank", json={"query": QUERY, "documents": ["a"], "rank_fields": ["title"]})
    assert fields.status_code == 422 and fields.json()["field"] == "rank_fields"
    anonymous = httpx.post(rerank_server + "/rerank", json={"query": QUERY, "texts": ["a"]})
    assert anonymous.status_code == 401  # read keys are set: a read needs one


def test_get_models_lists_the_rerankers(http):
    listing = http.get("/models").json()
    rerankers = {entry["id"]: entry for entry in listing["rerank_models"]}
    assert list(rerankers) == ["default", "tiny"] and listing["rerank_default"] == "default"
    assert all(entry["kind"] == "rerank" and entry["status"] == "ready" for entry in rerankers.values())
    assert rerankers["tiny"]["max_tokens"] == 64 and rerankers["default"]["backend"] == "torch"
    assert listing["models"][0]["kind"] == "embedding"


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_search_reranks_the_first_stages_candidates_in_every_mode(http, mode):
    body = {"query": QUERY, "mode": mode, "top_k": 3, "explain": True, "rerank": {"candidates": 8}}
    reply = http.post("/search", json=body)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert results[0]["id"] == "d0"
    assert len(results) == (1 if mode == "bm25" else 3)  # BM25 finds the query's words in one passage only
    scores = [hit["score"] for hit in results]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    for hit in results:
        assert hit["explain"]["rerank_score"] == hit["score"] and hit["explain"]["first_stage_rank"] >= 1
    # the score is the reranker's for the document's text, as /rerank gives it
    texts = [JUDGED[int(hit["id"][1:])][1] for hit in results]
    direct = http.post("/rerank", json={"query": QUERY, "texts": texts}).json()
    np.testing.assert_allclose(sorted(r["score"] for r in direct), sorted(scores), atol=1e-5)


def test_search_rerank_pages_from_the_reranked_candidates(http):
    first = http.post("/search", json={"query": QUERY, "top_k": 4, "rerank": {"candidates": 8}}).json()[
        "results"
    ]
    page = http.post("/search", json={"query": QUERY, "top_k": 2, "offset": 2, "rerank": {"candidates": 8}})
    assert [h["id"] for h in page.json()["results"]] == [h["id"] for h in first[2:4]]
    by_get = http.get("/search", params={"q": QUERY, "top_k": 4, "rerank": 8}).json()["results"]
    assert [h["id"] for h in by_get] == [h["id"] for h in first]


def test_the_python_client_and_the_langchain_retriever_rerank_here(rerank_server):
    with Client(rerank_server, api_key=READ_KEY) as client:
        results = client.rerank(QUERY, DOCUMENTS, return_text=True)
        assert results[0].index == 1 and results[0].text == RELEVANT and 0.5 < results[0].score < 1
        hits = client.search(QUERY, top_k=3, rerank=Rerank(candidates=8), explain=True)
        assert hits.results[0].id == "d0" and hits.results[0].explain.rerank_score == hits.results[0].score
    store = ClozeVectorStore(url=rerank_server, api_key=READ_KEY)
    retriever = store.as_retriever(search_kwargs={"k": 2, "mode": "hybrid", "rerank": 8})
    assert retriever.invoke(QUERY)[0].id == "d0"


def test_search_rerank_is_bounded(http):
    over = http.post("/search", json={"query": QUERY, "rerank": {"candidates": 21}})
    assert over.status_code == 422 and over.json()["field"] == "rerank.candidates"
    short = http.post("/search", json={"query": QUERY, "top_k": 10, "rerank": {"candidates": 5}})
    assert short.status_code == 422 and "offset + top_k" in short.json()["error"]
    unknown = http.post("/search", json={"query": QUERY, "rerank": {"candidates": 8, "model": "nope"}})
    assert unknown.status_code == 404 and unknown.json()["field"] == "rerank.model"
    assert "served: default, tiny" in unknown.json()["error"]


def test_a_service_without_a_reranker_says_so(client):
    """The shared e2e server configures no reranker: a clear 4xx on every rerank path."""
    search = client.post("/search", json={"query": "anything", "rerank": {"candidates": 10}})
    assert search.status_code == 422 and "CLOZE_RERANK_MODELS" in search.json()["error"]
    for path, body in (
        ("/rerank", {"query": "q", "texts": ["a"]}),
        ("/v1/rerank", {"query": "q", "documents": ["a"]}),
    ):
        reply = client.post(path, json=body)
        assert reply.status_code == 404 and "CLOZE_RERANK_MODELS" in reply.json()["error"], path
