"""How a filter's matches are ranked must not change what a search returns: the planner's ``Selection`` (from
the columns, or from SQL where the columns answer ``Unsupported``) scored exactly or as a bitmap inside FAISS,
in every mode; and a filter is parsed once a request, its tree never compiled to SQL while the columns answer."""

from __future__ import annotations

import random

import numpy as np
import pytest

import index.query.ranking as ranking
import index.storage.filters as filters_module
import index.storage.store as store_module
from index.records import Document
from index.search_index import SearchIndex
from index.storage.columns import Unsupported
from index.storage.filters import parse_filter
from tests.conftest import TINY_WORDS

FILTERS = [
    {"bucket": {"$lt": 9}},  # 90%
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


def unsupported(tree) -> None:
    raise Unsupported("the SQL backend's turn")


@pytest.mark.parametrize("filters", FILTERS)
def test_every_plan_returns_the_same_ranking(
    planned_index, tiny_encoder, monkeypatch: pytest.MonkeyPatch, filters
) -> None:
    exact = searches(planned_index, tiny_encoder, filters)  # 400 documents: scored exactly
    monkeypatch.setattr(ranking, "SELECTIVE_CHUNKS", 0)  # a bitmap inside FAISS
    assert searches(planned_index, tiny_encoder, filters) == exact
    monkeypatch.setattr(planned_index._live.columns, "select", unsupported)  # the SQL backend's rows
    assert searches(planned_index, tiny_encoder, filters) == exact
    assert any(exact), "nothing matched: the comparison proves nothing"


def test_a_filter_is_parsed_once_and_the_columns_answer_without_sql(
    planned_index, tiny_encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = parse_filter({"$or": [{"bucket": {"$gte": 5}}, {"tag": "x"}], "date": {"$ne": "2020-01-02"}})
    parses, compilations = [], []
    parse, compile_sql = filters_module._Parser.filter, store_module.to_sql
    monkeypatch.setattr(filters_module._Parser, "filter", lambda *a: parses.append(1) or parse(*a))
    monkeypatch.setattr(
        store_module, "to_sql", lambda *a, **k: compilations.append(1) or compile_sql(*a, **k)
    )
    assert any(searches(planned_index, tiny_encoder, tree))
    assert planned_index.facets(tree, ["bucket"])["total"] > 0
    assert parses == [] and compilations == []  # the service hands its parsed tree; the columns answer
    planned_index.count_documents(tree)  # listing and counting are SQL's: one compilation each
    assert parses == [] and len(compilations) == 1


def test_side_table_follows_updates_and_deletes(planned_index) -> None:
    planned_index.upsert([Document("moved", "cat", {"bucket": 42, "date": "2031-01-01"})])
    assert planned_index.count_documents({"bucket": 42}) == 1
    planned_index.upsert([Document("moved", "cat", {"bucket": 43})])
    assert planned_index.count_documents({"bucket": 42}) == 0
    assert planned_index.count_documents({"date": {"$gte": "2030-01-01"}}) == 0
    assert planned_index.count_documents({"bucket": 43}) == 1
    planned_index.delete("moved")
    assert planned_index.count_documents({"bucket": 43}) == 0
