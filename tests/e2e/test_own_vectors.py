"""Collections of the caller's own vectors on a real server: no model, one vector per document, checked on the
way in (length, NaN, infinity, zero for cosine); dense search by vector, BM25 and hybrid over the text, filters,
facets, paging and a snapshot restored."""

from __future__ import annotations

import httpx
import pytest

# Four axes, a document per axis (and one between two), so a ranking by vector is known in advance.
DOCS = [
    {"id": "north", "text": "cold winds over the tundra", "vector": [1, 0, 0, 0], "metadata": {"n": 1}},
    {"id": "east", "text": "spices and silk by the sea", "vector": [0, 1, 0, 0], "metadata": {"n": 2}},
    {
        "id": "south",
        "text": "warm sand and the tundra of dunes",
        "vector": [0, 0, 1, 0],
        "metadata": {"n": 3},
    },
    {"id": "west", "text": "gold rush towns", "vector": [0, 0, 0, 1], "metadata": {"n": 4}},
    {"id": "north-east", "text": "a port of spices", "vector": [1, 1, 0, 0], "metadata": {"n": 5}},
]


@pytest.fixture(scope="module")
def vectors(client) -> httpx.Client:
    created = client.post("/collections", json={"name": "own-vectors", "dimension": 4})
    assert created.status_code == 201, created.text
    assert created.json() | {"model": None, "dimension": 4, "metric": "cosine"} == created.json()
    assert client.put("/collections/own-vectors/documents", json=DOCS).json()["upserted"] == 5
    return client


def search(http: httpx.Client, collection: str = "own-vectors", **body) -> list[str]:
    answer = http.post(f"/collections/{collection}/search", json=body)
    assert answer.status_code == 200, answer.text
    return [hit["id"] for hit in answer.json()["results"]]


def test_dense_search_ranks_by_the_vectors_given(vectors):
    assert search(vectors, vector=[0.9, 0.1, 0, 0], top_k=2) == ["north", "north-east"]
    # A vector alone searches by vector (mode dense), scored by cosine: a length does not count.
    answer = vectors.post("/collections/own-vectors/search", json={"vector": [0, 5, 0, 0], "top_k": 1})
    assert answer.json()["mode"] == "dense"
    assert answer.json()["results"][0]["id"] == "east"
    assert answer.json()["results"][0]["score"] == pytest.approx(1.0, abs=1e-5)


def test_bm25_and_hybrid_work_over_the_text(vectors):
    assert set(search(vectors, query="tundra", mode="bm25")) == {"north", "south"}
    # Hybrid: both lists agree on "south" (its words and its vector); it leads.
    assert search(vectors, query="tundra", vector=[0, 0, 1, 0], mode="hybrid", top_k=3)[0] == "south"


def test_filters_and_paging_work_unchanged(vectors):
    ranked = search(vectors, vector=[1, 1, 1, 1], mode="dense", top_k=5, filter={"n": {"$gte": 2}})
    assert "north" not in ranked and len(ranked) == 4
    pages = [
        search(vectors, vector=[1, 1, 1, 1], top_k=2, offset=o, filter={"n": {"$gte": 2}}) for o in (0, 2)
    ]
    assert pages[0] + pages[1] == ranked
    listed, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = vectors.get("/collections/own-vectors/documents", params=params).json()
        listed += [d["id"] for d in page["documents"]]
        if not (cursor := page["next_cursor"]):
            break
    assert listed == sorted(d["id"] for d in DOCS)


def facets(http: httpx.Client, **body) -> dict:
    answer = http.post("/collections/own-vectors/facets", json={"fields": ["n"], **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_facets_count_the_filtered_documents(vectors):
    """No tokenizer, whole documents: the filter columns map each document's one chunk all the same."""
    found = facets(vectors, filter={"n": {"$in": [2, 4, 5]}})
    assert found["total"] == 3
    assert found["fields"]["n"]["numbers"] == {"min": 2, "max": 5}
    assert [v["value"] for v in found["fields"]["n"]["values"]] == [2, 4, 5]


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"id": "x", "text": "t", "vector": [1, 0, 0]}, "1.vector"),  # wrong length
        ({"id": "x", "text": "t", "vector": [1, 0, 0, 3.5e39]}, "1.vector"),  # an infinity in float32
        ({"id": "x", "text": "t", "vector": [0, 0, 0, 0]}, "1.vector"),  # no direction for cosine
        ({"id": "x", "text": "t"}, "1.vector"),  # a collection of own vectors needs one
    ],
)
def test_bad_vectors_are_refused_naming_the_field(vectors, document, field):
    answer = vectors.put("/collections/own-vectors/documents", json=[DOCS[0], document])
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert vectors.get("/collections/own-vectors/documents/x").status_code == 404  # nothing half-written


def test_a_nan_and_misplaced_vectors_are_refused(vectors):
    body = b'[{"id": "x", "text": "t", "vector": [NaN, 0, 0, 0]}]'
    nan = vectors.put(
        "/collections/own-vectors/documents", content=body, headers={"content-type": "application/json"}
    )
    assert nan.status_code == 422 and "NaN" in nan.text
    huge = body.replace(b"NaN", b"1e400")  # parsed as an infinity
    infinite = vectors.put(
        "/collections/own-vectors/documents", content=huge, headers={"content-type": "application/json"}
    )
    assert infinite.status_code == 422 and infinite.json()["field"].startswith("0.vector")
    short_query = vectors.post("/collections/own-vectors/search", json={"vector": [1, 0], "mode": "dense"})
    assert short_query.status_code == 422 and short_query.json()["field"] == "vector"
    no_vector = vectors.post("/collections/own-vectors/search", json={"query": "tundra", "mode": "dense"})
    assert no_vector.status_code == 422 and no_vector.json()["field"] == "vector"
    on_a_model = vectors.put("/documents", json=[{"id": "x", "text": "t", "vector": [1, 0, 0, 0]}])
    assert on_a_model.status_code == 422 and on_a_model.json()["field"] == "0.vector"
    rebuild = vectors.post("/collections/own-vectors/index/rebuild")
    assert rebuild.status_code == 409
    both = vectors.post("/collections", json={"name": "both", "model": "default", "dimension": 4})
    assert both.status_code == 422 and both.json()["field"] == "model"
    trained = vectors.post("/collections", json={"name": "ivf", "dimension": 4, "factory": "IVF4,Flat"})
    assert trained.status_code == 422 and trained.json()["field"] == "factory"


def test_dot_metric_keeps_the_length(client):
    assert (
        client.post("/collections", json={"name": "dot", "dimension": 2, "metric": "dot"}).status_code == 201
    )
    docs = [{"id": "short", "vector": [1, 0]}, {"id": "long", "vector": [3, 0.5]}]  # text is optional here
    assert client.put("/collections/dot/documents", json=docs).status_code == 200
    answer = client.post("/collections/dot/search", json={"vector": [1, 0]}).json()["results"]
    assert [hit["id"] for hit in answer] == ["long", "short"]
    assert answer[0]["score"] == pytest.approx(3.0, abs=1e-5)
    assert client.delete("/collections/dot").status_code == 200


def test_a_snapshot_restores_the_vectors(vectors):
    snapshot = vectors.post("/collections/own-vectors/snapshots")
    assert snapshot.status_code == 201, snapshot.text
    extra = {"id": "up", "text": "sky", "vector": [0.5, 0.5, 0.5, 0.5], "metadata": {"n": 9}}
    assert vectors.put("/collections/own-vectors/documents", json=[extra]).status_code == 200
    assert search(vectors, vector=[1, 1, 1, 1], top_k=1, filter={"n": 9}) == ["up"]
    assert facets(vectors)["fields"]["n"]["numbers"]["max"] == 9
    restored = vectors.post(f"/collections/own-vectors/snapshots/{snapshot.json()['name']}/restore")
    assert restored.status_code == 200, restored.text
    assert "up" not in search(vectors, vector=[1, 1, 1, 1], top_k=10)
    assert search(vectors, vector=[0, 0, 0, 1], top_k=1) == ["west"]
    # The restored version's filter columns are its own: the document written after the snapshot is gone.
    assert search(vectors, vector=[1, 1, 1, 1], top_k=10, filter={"n": 9}) == []
    assert facets(vectors)["total"] == 5 and facets(vectors)["fields"]["n"]["numbers"]["max"] == 5
