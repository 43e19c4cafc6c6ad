"""Units below the index: reciprocal rank fusion, convex fusion and explanations, the FTS5 query builder, the
filter-to-SQL compiler."""

from __future__ import annotations

import json
import sqlite3

import pytest

from index.query.ranking import (
    RRF_K,
    Explanation,
    Fusion,
    convex_fusion,
    explain,
    fuse,
    reciprocal_rank_fusion,
)
from index.records import UnknownFilterField
from index.storage.filters import InvalidFilterValue, parse_filter, to_sql
from index.text.analysis import MAX_QUERY_TERMS, fts_query, query_terms


def test_fusion_sums_reciprocal_ranks_and_orders_by_them() -> None:
    dense = [("a", 11), ("b", 12), ("c", 13)]
    sparse = [("c", None), ("a", None), ("d", None)]
    fused = reciprocal_rank_fusion([dense, sparse])
    scores = {doc: score for doc, score, _ in fused}
    assert scores["a"] == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + 2))
    assert scores["c"] == pytest.approx(1 / (RRF_K + 3) + 1 / (RRF_K + 1))
    assert scores["d"] == pytest.approx(1 / (RRF_K + 3))
    assert [doc for doc, _, _ in fused] == ["a", "c", "b", "d"]  # in both lists beats a better single rank


def test_fusion_keeps_the_chunk_a_list_knows() -> None:
    fused = reciprocal_rank_fusion([[("x", None)], [("x", 7)]])
    assert fused == [("x", pytest.approx(2 / (RRF_K + 1)), 7)]
    assert reciprocal_rank_fusion([[], []]) == []


def test_convex_fusion_weights_min_max_normalised_scores() -> None:
    dense = [("a", 0.9, 11), ("b", 0.7, 12), ("c", 0.5, 13)]
    sparse = [("c", 20.0), ("d", 10.0), ("a", 5.0)]
    fused = convex_fusion(dense, sparse, 0.5)
    scores = {doc: score for doc, score, _ in fused}
    # dense normalised: a 1, b 0.5, c 0; BM25: c 1, d 1/3, a 0; absent from a list: 0 there
    assert scores == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.5, "d": 1 / 6})
    assert [doc for doc, _, _ in fused] == ["a", "c", "b", "d"]  # a tie keeps dense order
    assert dict((d, c) for d, _, c in fused) == {"a": 11, "b": 12, "c": 13, "d": None}
    assert [d for d, _, _ in convex_fusion(dense, sparse, 1.0)][:3] == ["a", "b", "c"]  # dense alone
    assert [d for d, _, _ in convex_fusion(dense, sparse, 0.0)][:3] == ["c", "d", "a"]  # BM25 alone
    assert convex_fusion([("x", 0.3, 1)], [], 0.5) == [("x", 0.5, 1)]  # a one-item list normalises to 1
    assert convex_fusion([], [], 0.5) == []


def test_fuse_dispatches_and_fusion_bounds_are_checked() -> None:
    dense, sparse = [("a", 0.9, 1), ("b", 0.8, 2)], [("b", 3.0), ("a", 1.0)]
    assert fuse(dense, sparse, Fusion()) == reciprocal_rank_fusion(
        [[("a", 1), ("b", 2)], [("b", None), ("a", None)]]
    )
    k20 = {d: s for d, s, _ in fuse(dense, sparse, Fusion("rrf", k=20))}
    assert k20["a"] == pytest.approx(1 / 21 + 1 / 22)
    assert fuse(dense, sparse, Fusion("convex", alpha=0.7))[0][0] == "a"
    for bad in ({"k": 0}, {"alpha": -0.1}, {"alpha": 1.5}, {"method": "borda"}):
        with pytest.raises(ValueError):
            Fusion(**bad)  # type: ignore[arg-type]
    assert Fusion.parse("rrf:20") == Fusion("rrf", k=20) and Fusion.parse("rrf") == Fusion()
    assert Fusion.parse("convex:0.3") == Fusion("convex", alpha=0.3)
    with pytest.raises(ValueError):
        Fusion.parse("mean")


def test_explain_gives_each_lists_score_and_rank_or_none() -> None:
    dense = [("a", 0.9, 1), ("b", 0.8, 2)]
    sparse = [("c", 7.0), ("a", 2.0)]
    fused = reciprocal_rank_fusion([[(d, c) for d, _, c in dense], [(d, None) for d, _ in sparse]])
    page = fused[1:]  # a page below the first: ranks stay the lists' own
    out = explain(page, dense, sparse)
    assert set(out) == {d for d, _, _ in page}
    assert out["b"] == Explanation(0.8, 2, None, None, pytest.approx(1 / (RRF_K + 2)))
    assert out["c"] == Explanation(None, None, 7.0, 1, pytest.approx(1 / (RRF_K + 1)))
    assert explain([("a", 0.9, 1)], dense, None)["a"] == Explanation(0.9, 1, None, None, 0.9)


def test_fts_query_quotes_every_term_so_operators_are_words() -> None:
    assert fts_query('"foo AND(bar) OR baz*') == '"foo" OR "bar" OR "baz"'
    assert fts_query("The cat and THE cat") == '"cat"'  # stop words dropped, case folded, duplicates once
    assert fts_query("the of and") == ""  # nothing left to match: the caller answers no hits


def test_fts_query_is_bounded_and_runs_in_sqlite() -> None:
    text = " ".join(f"word{i}" for i in range(500))
    assert fts_query(text).count(" OR ") == MAX_QUERY_TERMS - 1
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61')")
    conn.executemany("INSERT INTO t VALUES (?)", [("an apple a day",), ('quote " and paren ( soup',)])
    for hostile in ['apple"', "AND(", "NEAR(x y)", "soup)", "-apple", "col:apple", "ünïcödé 東京"]:
        rows = conn.execute("SELECT text FROM t WHERE t MATCH ?", (fts_query(hostile) or '""',)).fetchall()
        assert isinstance(rows, list)  # parses: no sqlite3.OperationalError for any of them
    assert query_terms("Paris is the capital") == ["paris", "capital"]


@pytest.fixture
def documents() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE documents(rid INTEGER PRIMARY KEY, metadata TEXT)")
    rows = [
        {"year": 2020, "tag": "a", "draft": True},
        {"year": 2021, "tag": ["a", "b"], "draft": False},
        {"year": 2022, "tag": "c", "meta": {"k": 1}},
        {},
    ]
    conn.executemany("INSERT INTO documents(metadata) VALUES (?)", [(json.dumps(r),) for r in rows])
    return conn


def matching(conn: sqlite3.Connection, filters: dict, fields: set[str]) -> list[int]:
    where, params = to_sql(parse_filter(filters, fields))
    query = f"SELECT rid FROM documents d WHERE {where} ORDER BY rid"
    return [r[0] for r in conn.execute(query, params)]


FIELDS = {"year", "tag", "draft", "meta", "odd key"}


def test_filters_scalar_list_membership_and_conjunction(documents: sqlite3.Connection) -> None:
    assert matching(documents, {"year": 2021}, FIELDS) == [2]
    assert matching(documents, {"year": [2020, 2022]}, FIELDS) == [1, 3]
    assert matching(documents, {"tag": "a"}, FIELDS) == [1, 2]  # list-valued metadata: membership
    assert matching(documents, {"tag": "a", "year": 2021}, FIELDS) == [2]
    assert matching(documents, {"draft": True}, FIELDS) == [1]
    assert matching(documents, {"tag": []}, FIELDS) == []
    assert matching(documents, {}, FIELDS) == [1, 2, 3, 4]
    assert matching(documents, {"odd key": "x"}, FIELDS) == []  # a field name with a space is quoted


def test_filters_bind_values_and_refuse_unknown_fields(documents: sqlite3.Connection) -> None:
    where, params = to_sql(parse_filter({"tag": "a') OR 1=1 --"}, FIELDS))
    assert "OR 1=1" not in where and "a') OR 1=1 --" in params  # values are parameters, never SQL
    assert matching(documents, {"tag": "a') OR 1=1 --"}, FIELDS) == []
    with pytest.raises(UnknownFilterField, match="yaer"):
        parse_filter({"yaer": 2020}, FIELDS)
    for name in ('x"y', "x\\y", "x\x00y"):  # a JSON path cannot name them: refused, never searched
        with pytest.raises(InvalidFilterValue, match="filter: "):
            parse_filter({name: 1}, FIELDS | {name})
    with pytest.raises(InvalidFilterValue, match="in all"):
        parse_filter({f"f{i}": list(range(100)) for i in range(100)}, FIELDS)  # 10,100 bound together
