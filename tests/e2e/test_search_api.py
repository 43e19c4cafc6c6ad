"""Documents, search modes, filters, rebuild jobs, metrics and graceful shutdown over a real socket."""

from __future__ import annotations

import gzip
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness.servers import WRITE_KEY, serve_process

DEMO = Path(__file__).resolve().parents[2] / "app" / "demo" / "corpus.jsonl.gz"


def demo_documents(limit: int) -> list[dict]:
    docs = []
    with gzip.open(DEMO, "rt") as handle:
        for line in handle:
            record = json.loads(line)
            docs.append({"id": record.pop("id"), "text": record.pop("text"), "metadata": record})
            if len(docs) == limit:
                break
    return docs


@pytest.fixture(scope="module")
def loaded(client) -> list[dict]:
    docs = demo_documents(60)  # Washington .. Jefferson inaugurals
    for doc in docs:  # other modules share the server and store documents too: filters can pick these out
        doc["metadata"]["suite"] = "search-api"
    reply = client.put("/documents", json=docs)
    assert reply.status_code == 200 and reply.json()["upserted"] == 60
    return docs


def test_upsert_is_immediately_readable_and_searchable(client, loaded):
    doc = {
        "id": "note-1",
        "text": "The lighthouse keeper polished the great lens every night.",
        "metadata": {"kind": "note"},
    }
    assert client.put("/documents", json=[doc]).status_code == 200
    assert client.get("/documents/note-1").json()["text"] == doc["text"]
    for mode in ("dense", "bm25", "hybrid"):
        results = client.post("/search", json={"query": "lighthouse lens", "mode": mode, "top_k": 3}).json()[
            "results"
        ]
        assert results[0]["id"] == "note-1", mode
    assert client.delete("/documents/note-1").status_code == 200
    assert client.get("/documents/note-1").status_code == 404
    assert client.delete("/documents/note-1").status_code == 404
    assert all(
        r["id"] != "note-1" for r in client.get("/search", params={"q": "lighthouse lens"}).json()["results"]
    )


def test_search_returns_relevant_passages_with_chunk_and_latency(client, loaded):
    query = "anxious when summoned by my country from the retreat of my declining years"
    answer = client.get("/search", params={"q": query, "top_k": 5}).json()
    assert answer["mode"] == "hybrid" and answer["took_ms"] > 0
    assert answer["results"][0]["id"] == "1789-washington-inaugural-000"
    assert answer["results"][0]["chunk"] and answer["results"][0]["text"] is None


def test_filters_apply_before_top_k_and_unknown_fields_match_nothing(client, loaded):
    body = {"query": "liberty and union", "top_k": 5, "filter": {"president": "Adams"}, "include_text": True}
    results = client.post("/search", json=body).json()["results"]
    assert results and all(r["metadata"]["president"] == "Adams" for r in results)
    assert all(r["text"] for r in results)
    several = client.post("/search", json={**body, "filter": {"year": [1793, 1797]}}).json()["results"]
    assert several and {r["metadata"]["year"] for r in several} <= {1793, 1797}
    unknown = client.post("/search", json={**body, "filter": {"colour": "red"}})  # MongoDB: absent, no match
    assert unknown.status_code == 200 and unknown.json()["results"] == []
    negated = client.post("/search", json={**body, "filter": {"colour": {"$ne": "red"}}}).json()["results"]
    assert len(negated) == 5


def test_filter_operators_ranges_and_paging_over_http(client, loaded):
    years = {d["metadata"]["year"] for d in loaded}
    body = {"query": "the people and their government", "top_k": 100, "mode": "dense"}
    ours = {"suite": "search-api"}
    ranged = {"$or": [{"year": {"$gte": 1801, "$lt": 1809}}, {"president": "Washington"}], **ours}
    results = client.post("/search", json={**body, "filter": ranged}).json()["results"]
    expected = [
        d
        for d in loaded
        if 1801 <= d["metadata"]["year"] < 1809 or d["metadata"]["president"] == "Washington"
    ]
    assert {r["id"] for r in results} == {d["id"] for d in expected}  # every match, before top-k
    negated = {"year": {"$nin": sorted(years)[1:]}, "$not": {"kind": {"$ne": "inaugural"}}, **ours}
    assert {
        r["metadata"]["year"]
        for r in client.post("/search", json={**body, "filter": negated}).json()["results"]
    } == {min(years)}
    for bad, field in [
        ({"year": {"$gt": "seventeen"}}, "filter.year.$gt"),
        ({"$or": [{"year": 1789}, {"year": {"$between": [1, 2]}}]}, "filter.$or.1.year.$between"),
        ({"$and": [{"year": {"$in": "1789"}}]}, "filter.$and.0.year.$in"),
    ]:
        reply = client.post("/search", json={**body, "filter": bad})
        assert reply.status_code == 422 and reply.json()["field"] == field, (bad, reply.text)
    pages = [
        client.post("/search", json={**body, "top_k": 5, "offset": offset}).json()["results"]
        for offset in (0, 5)
    ]
    whole = client.post("/search", json={**body, "top_k": 10}).json()["results"]
    assert [r["id"] for page in pages for r in page] == [r["id"] for r in whole]
    assert [
        r["id"]
        for r in client.get(
            "/search", params={"q": body["query"], "mode": "dense", "offset": 5, "top_k": 5}
        ).json()["results"]
    ] == [r["id"] for r in pages[1]]
    too_deep = client.post("/search", json={**body, "top_k": 10, "offset": 995})
    assert too_deep.status_code == 422 and too_deep.json()["field"] == "offset"
    schema = client.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]["properties"]
    assert all(
        op in schema["filter"]["description"]
        for op in (
            "$eq",
            "$ne",
            "$in",
            "$nin",
            "$gt",
            "$gte",
            "$lt",
            "$lte",
            "$exists",
            "$and",
            "$or",
            "$not",
        )
    )
    assert schema["filter"]["examples"] and "offset" in schema


def test_highlights_fusion_and_explain_over_http(client, loaded):
    body = {"query": "the governments of free people", "top_k": 5, "mode": "hybrid"}
    plain = client.post("/search", json=body).json()["results"]
    assert all(r["highlights"] is None and r["explain"] is None for r in plain)  # only when asked
    asked = client.post("/search", json={**body, "highlight": True, "explain": True}).json()["results"]
    assert [r["id"] for r in asked] == [r["id"] for r in plain]  # the same ranking (RRF k 60 by default)
    marked = [r["chunk"][a:b].lower() for r in asked for a, b in r["highlights"]]
    assert marked and all(w.startswith(("govern", "free", "peopl")) for w in marked), marked
    assert "the" not in marked and "of" not in marked  # stop words never
    for r in asked:
        why = r["explain"]
        assert why["fused_score"] == pytest.approx(r["score"])
        assert why["dense_rank"] or why["bm25_rank"]
    convex = {**body, "fusion": {"method": "convex", "alpha": 0.5}, "explain": True}
    for r in client.post("/search", json=convex).json()["results"]:
        assert 0 <= r["score"] <= 1 and r["explain"]["fused_score"] == pytest.approx(r["score"])
    rrf20 = client.post("/search", json={**body, "fusion": {"method": "rrf", "k": 20}}).json()["results"]
    assert rrf20[0]["score"] > plain[0]["score"]  # 1 / (20 + rank) > 1 / (60 + rank)
    dense = client.get("/search", params={"q": body["query"], "mode": "dense", "explain": True}).json()
    assert all(r["explain"]["bm25_rank"] is None for r in dense["results"])
    for fusion, field in [
        ({"method": "rrf", "k": 0}, "fusion.k"),
        ({"method": "convex", "alpha": 1.5}, "fusion.alpha"),
        ({"method": "convex", "alpha": -0.1}, "fusion.alpha"),
        ({"method": "borda"}, "fusion.method"),
        ({"method": "rrf", "alpha": 0.5}, "fusion.alpha"),  # each parameter belongs to one method
        ({"method": "convex", "k": 60}, "fusion.k"),
    ]:
        reply = client.post("/search", json={**body, "fusion": fusion})
        assert reply.status_code == 422 and reply.json()["field"] == field, (fusion, reply.text)
    wrong_mode = client.post("/search", json={**body, "mode": "dense", "fusion": {"method": "rrf"}})
    assert wrong_mode.status_code == 422 and wrong_mode.json()["field"] == "fusion"
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    request = schema["SearchRequest"]["properties"]
    assert all(request[name].get("examples") for name in ("highlight", "fusion", "explain"))
    assert "highlights" in schema["SearchResult"]["properties"] and "SearchExplanation" in schema


def test_bm25_survives_query_syntax(client, loaded):
    for query in ['"unbalanced', "AND OR NOT (", "*", "a:b", "NEAR(x y)"]:
        assert client.post("/search", json={"query": query, "mode": "bm25"}).status_code == 200, query


def test_rebuild_job_publishes_while_searches_keep_answering(client, loaded):
    job_id = client.post("/index/rebuild").json()["job_id"]
    statuses = set()
    for _ in range(600):
        assert client.get("/search", params={"q": "government of the people"}).status_code == 200
        job = client.get(f"/jobs/{job_id}").json()
        statuses.add(job["status"])
        if job["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    assert job["status"] == "succeeded", job
    assert job["progress"] == 1.0 and job["manifest"]["documents"] >= 60
    assert client.get("/models").json()["index"]["version"] == job["manifest"]["version"]
    assert client.get("/jobs/nope").status_code == 404


def test_metrics_expose_routes_queue_batches_and_index(client, loaded):
    client.post("/embed", json={"inputs": ["metrics please"]})
    text = client.get("/metrics").text
    for needle in (
        'cloze_requests_total{method="POST",route="/embed",status="200"}',
        "cloze_request_seconds_bucket",
        'cloze_queue_depth{batcher="embed"}',
        "cloze_batch_size_bucket",
        "cloze_batch_tokens_bucket",
        'cloze_index_size{unit="documents"}',
    ):
        assert needle in text, needle


def test_graceful_shutdown_drains_in_flight_requests(server_env, tmp_path):
    env = {**server_env, "CLOZE_INDEX": str(tmp_path / "idx"), "CLOZE_BACKEND": "torch"}
    log = tmp_path / "log"
    with serve_process(env, log) as (url, process):
        replies: list[httpx.Response] = []
        slow = threading.Thread(
            target=lambda: replies.append(
                httpx.post(
                    url + "/embed",
                    json={
                        "inputs": ["a fairly long sentence about many things " * 20] * 64,
                        "truncate": True,
                    },
                    headers={"Authorization": f"Bearer {WRITE_KEY}"},
                    timeout=60,
                )
            )
        )
        slow.start()
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        slow.join(60)
        assert replies and replies[0].status_code == 200 and len(replies[0].json()) == 64
        # uvicorn drains, then re-raises the signal so supervisors see how the process ended
        assert process.wait(60) in (0, -signal.SIGTERM)
        assert "Waiting for connections to close" in log.read_text() or "Shutting down" in log.read_text()


def test_listing_pages_through_the_documents_with_a_filter(client, loaded):
    wanted = {"year": {"$gte": 1801}, "suite": "search-api"}  # the server holds other modules' documents
    matching = sorted(d["id"] for d in loaded if d["metadata"]["year"] >= 1801)
    seen, cursor, totals = [], None, set()
    while True:
        params = {"limit": 3, "filter": json.dumps(wanted), **({"cursor": cursor} if cursor else {})}
        page = client.get("/documents", params=params).json()
        seen += [d["id"] for d in page["documents"]]
        totals.add(page["total"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == matching and totals == {len(matching)}  # in id order, each once
    every = client.get("/documents", params={"limit": 1000}).json()
    assert every["total"] >= len(loaded) and every["next_cursor"] is None
    absent = client.get("/documents", params={"filter": json.dumps({"colour": {"$ne": "red"}})}).json()
    assert absent["total"] == every["total"]  # a field no document has: its negation matches every one
    for params, field in [
        ({"cursor": "not-a-cursor!"}, "cursor"),
        ({"filter": "{not json"}, "filter"),
        ({"filter": json.dumps({"year": {"$lt": "soon"}})}, "filter.year.$lt"),
        ({"limit": 0}, "limit"),
    ]:
        reply = client.get("/documents", params=params)
        assert reply.status_code == 422 and reply.json()["field"] == field, (params, reply.text)


def test_facets_count_the_matches_values_and_span_numbers_and_dates(client, loaded):
    """POST /facets (and a collection's): value counts of the documents a filter matches, the least and greatest
    number and date, each field's type; the same 422s as /search for a bad filter, and bounded fields."""
    ours = {"suite": "search-api"}
    adams = [d for d in loaded if d["metadata"]["president"] == "Adams"]
    body = {
        "filter": {**ours, "year": {"$lt": 1801}},
        "fields": ["president", "year", "kind", "nowhere"],
        "top": 3,
    }
    answer = client.post("/facets", json=body)
    assert answer.status_code == 200, answer.text
    found = answer.json()
    early = [d for d in loaded if d["metadata"]["year"] < 1801]
    assert found["total"] == len(early)
    presidents = {}
    for d in early:
        presidents[d["metadata"]["president"]] = presidents.get(d["metadata"]["president"], 0) + 1
    expected = sorted(presidents.items(), key=lambda item: (-item[1], item[0]))[:3]
    assert [(v["value"], v["count"]) for v in found["fields"]["president"]["values"]] == expected
    years = found["fields"]["year"]
    assert years["type"] == "number" and years["documents"] == len(early)
    assert years["numbers"] == {"min": min(d["metadata"]["year"] for d in early), "max": 1797}
    assert found["fields"]["nowhere"] == {
        "type": None,
        "documents": 0,
        "values": [],
        "numbers": None,
        "dates": None,
    }
    assert adams and found["fields"]["president"]["values"]

    dated = [
        {"id": f"facet-{i}", "text": f"dated note {i}", "metadata": {"facet_suite": True, "when": when}}
        for i, when in enumerate(["1969-07-21T20:17:40Z", "1969-07-21T22:17:40+02:00", "2024-02-29"])
    ]
    assert client.put("/documents", json=dated).status_code == 200
    scoped = client.post(
        "/collections/default/facets", json={"filter": {"facet_suite": True}, "fields": ["when"]}
    ).json()
    when = scoped["fields"]["when"]
    assert when["type"] == "date" and when["dates"] == {"min": "1969-07-21T20:17:40Z", "max": "2024-02-29"}
    assert {v["count"] for v in when["values"]} == {1}  # values as written: two spellings of one instant
    same = client.post("/facets", json={"filter": {"when": "1969-07-21T20:17:40"}, "fields": ["when"]}).json()
    assert same["total"] == 2  # but one instant to a filter
    for bad, field in [
        ({"fields": []}, "fields"),
        ({"fields": ["x"] * 65}, "fields"),
        ({"fields": ["year"], "filter": {"year": {"$gt": "soon"}}}, "filter.year.$gt"),
        ({"fields": ['a"b']}, "fields[0]"),
        ({"fields": ["year"], "top": 0}, "top"),
    ]:
        reply = client.post("/facets", json=bad)
        assert reply.status_code == 422 and reply.json()["field"] == field, (bad, reply.text)
    for doc in dated:
        assert client.delete(f"/documents/{doc['id']}").status_code == 200
