"""How a filter is applied must not change what a search returns: a broad filter tests the unfiltered
candidates row by row (``ranking.post_filtered``, ``OpenVersion.bm25``), a selective one lists its matches
through the ``doc_values`` side table; both give the ranking of listing every match first, and so do the
in-memory columns' plans (the matches scored exactly, or a bitmap inside FAISS)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import index.query.ranking as ranking
import index.storage.version as version
from index.records import Document
from index.search_index import SearchIndex
from tests.conftest import TINY_WORDS

FILTERS = [
    {"bucket": {"$lt": 9}},  # 90%: post-filtered
    {"bucket": {"$gte": 5}},  # 50%
    {"$or": [{"bucket": 3}, {"tag": "x"}]},
    {"bucket": 7},  # 10%
    {"date": {"$gte": "2020-01-05"}},
    {"bucket": {"$nin": [1, 2]}},
]


@pytest.fixture(scope="module")
def planned_index(tmp_path_factory: pytest.TempPathFactory, tiny_encoder):
    index = SearchIndex.open(tmp_path_factory.mktemp("planning") / "idx", tiny_encoder)
    rng = random.Random(7)
    docs = [
        Document(
            f"d{i}",
            " ".join(rng.choice(TINY_WORDS) for _ in range(10)),
            {"bucket": i % 10, "date": f"2020-01-{1 + i % 9:02d}", "tag": ["x", "y"][i % 2]},
        )
        for i in range(400)
    ]
    index.upsert(docs)
    index.wait_for_lexical()
    yield index
    index.close()


def searches(index: SearchIndex, tiny_encoder, filters) -> list[list[tuple[str, float]]]:
    out = []
    for seed, word in enumerate(TINY_WORDS[:6]):
        query = np.random.default_rng(seed).standard_normal(tiny_encoder.dimension).astype(np.float32)
        query /= np.linalg.norm(query)
        for mode in ("dense", "bm25", "hybrid"):
            hits = index.search(query, word, top_k=5, mode=mode, filters=filters)
            out.append([(h.id, round(h.score, 5)) for h in hits])
    return out


@pytest.mark.parametrize("filters", FILTERS)
def test_post_filtering_returns_what_listing_the_matches_returns(
    planned_index, tiny_encoder, monkeypatch: pytest.MonkeyPatch, filters
) -> None:
    store = planned_index._live.store
    tested = []
    original = store.matching_chunks
    monkeypatch.setattr(store, "matching_chunks", lambda ids, f: tested.append(len(ids)) or original(ids, f))
    monkeypatch.setattr(planned_index._live, "columns_enabled", False)  # SQLite's plans first
    planned = searches(planned_index, tiny_encoder, filters)
    monkeypatch.setattr(ranking, "TESTED_PER_MATCH", 0.0)  # never post-filter: list every match first
    monkeypatch.setattr(version, "TESTED_PER_MATCH", 0.0)
    listed = searches(planned_index, tiny_encoder, filters)
    assert planned == listed
    if store.match_rate(filters) >= 0.5:
        assert tested, "a broad filter was not post-filtered"
    monkeypatch.setattr(planned_index._live, "columns_enabled", True)  # the columns' two plans
    assert searches(planned_index, tiny_encoder, filters) == listed
    monkeypatch.setattr(ranking, "SELECTIVE_CHUNKS", 0)
    assert searches(planned_index, tiny_encoder, filters) == listed


def test_match_rate_estimates_selectivity(planned_index) -> None:
    store = planned_index._live.store
    assert store.match_rate({"bucket": {"$lt": 9}}) == pytest.approx(0.9, abs=0.06)
    assert store.match_rate({"bucket": 7}) == pytest.approx(0.1, abs=0.06)
    assert store.match_rate({"bucket": 11}) == 0.0


def test_side_table_follows_updates_and_deletes(planned_index) -> None:
    planned_index.upsert([Document("moved", "cat", {"bucket": 42, "date": "2031-01-01"})])
    assert planned_index.count_documents({"bucket": 42}) == 1
    planned_index.upsert([Document("moved", "cat", {"bucket": 43})])
    assert planned_index.count_documents({"bucket": 42}) == 0
    assert planned_index.count_documents({"date": {"$gte": "2030-01-01"}}) == 0
    assert planned_index.count_documents({"bucket": 43}) == 1
    planned_index.delete("moved")
    assert planned_index.count_documents({"bucket": 43}) == 0
