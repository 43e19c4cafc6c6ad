"""Values every plan must represent or compare alike, through the HTTP app in-process (no model: collections
of the caller's own vectors): dot-product scores that stay finite, integers past 2**53 counted exactly by
facets, date offsets SQLite reads, and an upsert that says whether it is searchable yet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.service.engines import close_engines
from app.service.main import create_app
from app.settings import Settings
from index.storage.vectors import VectorIndex

FLOAT32_MAX = 3.4028234663852886e38


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = Path(tmp_path_factory.mktemp("bounds"))
    app = create_app(Settings(index=root / "idx", collections_dir=root / "collections"))
    client = TestClient(app, base_url="http://127.0.0.1")  # not as a context: no lifespan, no model loads
    for name, metric in (("dot", "dot"), ("cosine", "cosine")):
        created = client.post("/collections", json={"name": name, "dimension": 3, "metric": metric})
        assert created.status_code == 201, created.text
    yield client
    asyncio.run(close_engines(app.state.engines, app.state.lifecycle))


def put(http: TestClient, collection: str, docs: list[dict]):
    return http.put(f"/collections/{collection}/documents", json=docs)


def test_dot_vectors_whose_scores_would_overflow_are_refused(http: TestClient) -> None:
    """float32 holds 3.4e38: a dot product of two vectors of norm 1e19 and 2e19 would not. Both lengths are
    bounded (1e19, so every product of two stays within 1e38), at upsert and in a query."""
    big = [1e19, 0.0, 0.0]  # at the bound: accepted
    fine = put(http, "dot", [{"id": "big", "vector": big}, {"id": "unit", "vector": [1, 0, 0]}])
    assert fine.status_code == 200, fine.text
    for vector in ([FLOAT32_MAX, 0, 0], [1e19, 1e19, 0], [-2e19, 0, 0]):
        refused = put(http, "dot", [{"id": "ok", "vector": [0, 1, 0]}, {"id": "huge", "vector": vector}])
        assert refused.status_code == 422, refused.text
        assert refused.json()["field"] == "1.vector" and "norm" in refused.json()["error"]
        query = http.post("/collections/dot/search", json={"vector": vector})
        assert query.status_code == 422 and query.json()["field"] == "vector"
    assert http.get("/collections/dot/documents/ok").status_code == 404  # nothing of a refused batch
    for vector in (big, [-1e19, 0, 0], [0, 1e19, 0]):
        answer = http.post("/collections/dot/search", json={"vector": vector})
        assert answer.status_code == 200, answer.text
        scores = [hit["score"] for hit in answer.json()["results"]]
        assert all(isinstance(s, float) and abs(s) <= 1e38 for s in scores), scores
    # Cosine normalises what it is given: any finite float32 vector has a direction.
    assert put(http, "cosine", [{"id": "far", "vector": [FLOAT32_MAX, FLOAT32_MAX, 0]}]).status_code == 200
    answer = http.post("/collections/cosine/search", json={"vector": [FLOAT32_MAX, 0, 0]})
    assert answer.json()["results"][0]["score"] == pytest.approx(2**-0.5, abs=1e-5)


def test_facets_count_integers_past_2_53_exactly(http: TestClient) -> None:
    """float64 holds every integer up to 2**53 only: 2**60, 2**60 + 1 and 2**60 + 2 were one facet value counted
    three times, while a filter on each (answered by SQLite) found one document."""
    wide = [2**60, 2**60 + 1, 2**60 + 2]
    docs = [{"id": f"w{i}", "vector": [1, i, 0], "metadata": {"wide": n}} for i, n in enumerate(wide)]
    docs.append({"id": "w3", "vector": [1, 3, 0], "metadata": {"wide": [2**60, 2**60 + 2, 7.5]}})
    assert put(http, "cosine", docs).status_code == 200
    for n in wide:
        found = http.post("/collections/cosine/search", json={"vector": [1, 0, 0], "filter": {"wide": n}})
        assert found.status_code == 200 and len(found.json()["results"]) == 2 - (n == 2**60 + 1)
    facets = http.post("/collections/cosine/facets", json={"fields": ["wide"]})
    assert facets.status_code == 200, facets.text
    field = facets.json()["fields"]["wide"]
    assert field["values"] == [
        {"value": 2**60, "count": 2},
        {"value": 2**60 + 2, "count": 2},
        {"value": 7.5, "count": 1},  # ties by magnitude
        {"value": 2**60 + 1, "count": 1},
    ]
    assert field["numbers"] == {"min": 7.5, "max": 2**60 + 2} and field["type"] == "number"
    narrowed = http.post(
        "/collections/cosine/facets", json={"fields": ["wide"], "filter": {"wide": 2**60 + 1}}
    )
    assert narrowed.json()["fields"]["wide"]["values"] == [{"value": 2**60 + 1, "count": 1}]


def test_dates_compare_alike_in_every_plan_or_are_refused(http: TestClient) -> None:
    """SQLite's julianday() reads UTC offsets up to +-14:59: a date-time past that was stored, but every range
    on it matched nothing and its $ne everything. Refused in metadata and in filters; the widest it reads
    (+14:00 is Kiribati's) compares as an instant."""
    docs = [
        {
            "id": "kiribati",
            "vector": [0, 0, 1],
            "metadata": {"when": "2020-01-02T00:30+14:00"},
        },  # 10:30Z on 1 Jan
        {"id": "utc", "vector": [0, 1, 1], "metadata": {"when": "2020-01-01T12:00Z"}},
    ]
    assert put(http, "cosine", docs).status_code == 200

    def found(filters: dict) -> list[str]:
        answer = http.post("/collections/cosine/search", json={"vector": [0, 0, 1], "filter": filters})
        assert answer.status_code == 200, answer.text
        return sorted(hit["id"] for hit in answer.json()["results"])

    assert found({"when": {"$lt": "2020-01-01T11:00Z"}}) == ["kiribati"]
    assert found({"when": {"$ne": "2020-01-01T10:30:00"}}) == [d for d in found({}) if d != "kiribati"]
    for offset in ("+15:00", "-14:60", "+23:59"):
        late = {
            "id": "late",
            "vector": [1, 1, 1],
            "metadata": {"at": ["x", {"when": f"2020-01-01T00:00{offset}"}]},
        }
        refused = put(http, "cosine", [late])
        assert refused.status_code == 422 and refused.json()["field"] == "0.metadata.at.1.when", refused.text
        for op in ("$gte", "$ne", "$in"):
            operand = [f"2020-01-01T00:00{offset}"] if op == "$in" else f"2020-01-01T00:00{offset}"
            answer = http.post(
                "/collections/cosine/search", json={"vector": [0, 0, 1], "filter": {"when": {op: operand}}}
            )
            assert answer.status_code == 422 and answer.json()["field"] == f"filter.when.{op}", answer.text
    assert http.get("/collections/cosine/documents/late").status_code == 404


def test_an_upsert_says_whether_search_finds_it_yet(http: TestClient, monkeypatch) -> None:
    """A write that landed but could not be applied to the vectors was answered `searchable: true`."""

    def out_of_memory(self, ids, vectors):
        raise MemoryError("simulated")

    monkeypatch.setattr(VectorIndex, "add", out_of_memory)
    first = put(http, "dot", [{"id": "landed", "vector": [0, 0, 5]}])
    assert first.status_code == 200 and first.json() == {"upserted": 1, "searchable": False}
    assert http.get("/collections/dot/documents/landed").status_code == 200  # durable all the same
    monkeypatch.undo()
    second = put(http, "dot", [{"id": "next", "vector": [0, 0, 4]}])
    assert second.json() == {"upserted": 1, "searchable": True}
    top = http.post("/collections/dot/search", json={"vector": [0, 0, 1], "top_k": 2}).json()["results"]
    assert [hit["id"] for hit in top] == ["landed", "next"]  # the second write's catch-up replayed the first
