"""Filters against an oracle: random metadata and random filters, parsed once into a tree; the tree's two
backends (SQL, over each document's JSON and over the side table, and the in-memory columns) and every search
mode compared with a brute-force evaluation in plain Python (the grammar's rules, written out once more here).

Each test prints how many examples it ran (``pytest -s`` shows it; the counts are also asserted).
"""

from __future__ import annotations

import json
import random
import sqlite3
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from index.query import ranking
from index.records import Document, InvalidDocument, UnknownFilterField, check_document
from index.search_index import SearchIndex
from index.storage import columns as columns_module
from index.storage.columns import Columns, Unsupported
from index.storage.filters import InvalidFilterValue, parse_filter, to_sql
from index.storage.store import FILL_VALUES
from index.text.analysis import words
from tests.conftest import TINY_WORDS

FIELDS = ["a", "b", "c", "d"]
ABSENT = "never"  # a field no document has: filters name it too (MongoDB's absent field)
STRINGS = ["red", "green", "blue", "1", "2020"]
DATES = [  # several spellings of the same instants, with and without offsets (no offset: UTC)
    "2020-01-01",
    "2020-01-01T00:00:00.000",
    "2019-12-31T23:00:00-01:00",
    "2020-01-01T12:00:00Z",
    "2020-01-01T14:00:00+02:00",
    "2020-01-01 08:30",
    "2020-06-15T00:00:00.250Z",
    "2021-03-01",
]
QUERY_WORDS = ["cat", "dog", "paris", "river", "king", "queen", "guitar", "music", "book"]

ints = st.integers(-3, 3)
floats = st.integers(-12, 12).map(lambda i: i / 4)  # exact in binary: SQLite's JSON parser reads them back
numbers = st.one_of(ints, floats)
scalars = st.one_of(numbers, st.sampled_from(STRINGS), st.sampled_from(DATES), st.booleans())
metadata_values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.none(),
    st.fixed_dictionaries({"k": ints}),  # an object value: its members are not elements
)
metadata = st.dictionaries(st.sampled_from(FIELDS), metadata_values, max_size=4)

range_operands = st.one_of(numbers, st.sampled_from(DATES), st.none())
value_lists = st.lists(scalars, max_size=3)
operator_entries = st.one_of(
    st.tuples(st.sampled_from(["$eq", "$ne"]), scalars),
    st.tuples(st.sampled_from(["$in", "$nin"]), value_lists),
    st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), range_operands),
    st.tuples(st.just("$exists"), st.booleans()),
)
operator_objects = st.lists(operator_entries, min_size=1, max_size=2, unique_by=lambda e: e[0]).map(dict)
field_values = st.one_of(
    scalars,
    value_lists,
    operator_objects,
    operator_objects.map(lambda ops: {"$not": ops}),
    scalars.map(lambda v: {"$not": v}),
)
field_filters = st.dictionaries(st.sampled_from([*FIELDS, ABSENT]), field_values, min_size=1, max_size=2)
filters = st.recursive(
    field_filters,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$and": fs}),
        st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$or": fs}),
        inner.map(lambda f: {"$not": f}),
        st.tuples(inner, field_filters).map(lambda pair: {**pair[1], "$and": [pair[0]]}),
    ),
    max_leaves=6,
)


# ---- the oracle -----------------------------------------------------------------------------------------


def instant(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def elements(meta: dict[str, Any], name: str) -> list[Any]:
    if name not in meta or isinstance(meta[name], dict):
        return []
    value = meta[name]
    return value if isinstance(value, list) else [value]


def equal(element: Any, wanted: Any) -> bool:
    if isinstance(wanted, bool):
        return element is wanted
    if is_number(wanted):
        return is_number(element) and element == wanted
    if wanted in DATES:  # an ISO date operand is an instant, in equality as in ranges
        return element in DATES and instant(element) == instant(wanted)
    return isinstance(element, str) and element == wanted


def compare(op: str, left: Any, right: Any) -> bool:
    return {"$gt": left > right, "$gte": left >= right, "$lt": left < right, "$lte": left <= right}[op]


def operator_holds(meta: dict[str, Any], name: str, op: str, operand: Any) -> bool:
    found = elements(meta, name)
    if op == "$exists":
        return (name in meta) is operand
    if op == "$not":
        return not field_holds(meta, name, operand)
    if op in ("$eq", "$ne"):
        hit = any(equal(e, operand) for e in found)
        return hit if op == "$eq" else not hit
    if op in ("$in", "$nin"):
        hit = any(equal(e, v) for e in found for v in operand)
        return hit if op == "$in" else not hit
    if operand is None:  # a null range bound matches nothing
        return False
    if is_number(operand):
        return any(is_number(e) and compare(op, e, operand) for e in found)
    return any(e in DATES and compare(op, instant(e), instant(operand)) for e in found)


def field_holds(meta: dict[str, Any], name: str, value: Any) -> bool:
    if isinstance(value, dict):
        return all(operator_holds(meta, name, op, operand) for op, operand in value.items())
    if isinstance(value, list):
        return operator_holds(meta, name, "$in", value)
    return operator_holds(meta, name, "$eq", value)


def holds(meta: dict[str, Any], node: dict[str, Any]) -> bool:
    for key, value in node.items():
        if key == "$and" and not all(holds(meta, f) for f in value):
            return False
        if key == "$or" and not any(holds(meta, f) for f in value):
            return False
        if key == "$not" and holds(meta, value):
            return False
        if not key.startswith("$") and not field_holds(meta, key, value):
            return False
    return True


# ---- both backends against the oracle ----------------------------------------------------------------

BACKEND_EXAMPLES = 400
ran = {"backends": 0, "modes": 0}


class MemoryStore:
    """What ``Columns.load`` reads of a store, over an in-memory database with the store's tables."""

    values_table = True

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def query(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)


def metadata_database(rows: list[dict[str, Any]]) -> sqlite3.Connection:
    """``documents`` (rid from 1), its ``doc_values`` side table, and no chunks."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE documents(rid INTEGER PRIMARY KEY, metadata TEXT NOT NULL)")
    conn.executemany("INSERT INTO documents(metadata) VALUES (?)", [(json.dumps(r),) for r in rows])
    conn.execute(
        "CREATE TABLE doc_values(doc_rid INTEGER NOT NULL, field TEXT NOT NULL, type TEXT NOT NULL, value, num REAL)"
    )
    conn.execute(FILL_VALUES + "1")
    conn.execute("CREATE TABLE chunks(id INTEGER PRIMARY KEY, doc_rid INTEGER NOT NULL)")
    return conn


def backends_select(rows: list[dict[str, Any]]):
    """``rids(node)``: the rids (from 1) of ``rows`` matching ``node``, the same from each backend."""
    conn = metadata_database(rows)
    columns = Columns.load(MemoryStore(conn))

    def rids(node: dict[str, Any]) -> list[int]:
        tree = parse_filter(node)
        found = [np.flatnonzero(columns.select(tree).documents).tolist()]
        for values_table in (False, True):
            where, params = to_sql(tree, values_table)
            found.append(
                [
                    r[0]
                    for r in conn.execute(f"SELECT rid FROM documents d WHERE {where} ORDER BY rid", params)
                ]
            )
        assert found[0] == found[1] == found[2], (node, found)
        return found[0]

    return rids


@settings(max_examples=BACKEND_EXAMPLES, deadline=None)
@given(rows=st.lists(metadata, min_size=1, max_size=12), node=filters)
def test_both_backends_match_the_oracle(rows: list[dict[str, Any]], node: dict[str, Any]) -> None:
    """One tree, three evaluations: SQL over each document's JSON, SQL over the store's ``doc_values`` side
    table, and the in-memory columns' masks; each equals the oracle, so the backends equal each other."""
    ran["backends"] += 1
    conn = metadata_database(rows)
    tree = parse_filter(node)
    expected = {rid for rid, meta in enumerate(rows, start=1) if holds(meta, node)}
    for values_table in (False, True):
        where, params = to_sql(tree, values_table)
        got = {r[0] for r in conn.execute(f"SELECT rid FROM documents d WHERE {where}", params)}
        assert got == expected, (values_table, node, rows)
    columns = Columns.load(MemoryStore(conn))
    for few in (columns_module.FEW_VALUES, 0):  # equalities one pass per value, and by isin / a code table
        columns_module.FEW_VALUES, saved = few, columns_module.FEW_VALUES
        try:
            masked = columns.select(tree).documents
        finally:
            columns_module.FEW_VALUES = saved
        assert set(np.flatnonzero(masked).tolist()) == expected, ("columns", few, node, rows)


def test_backends_oracle_ran_its_examples() -> None:
    print(f"\ntest_both_backends_match_the_oracle ran {ran['backends']} examples")
    assert ran["backends"] == BACKEND_EXAMPLES or ran["backends"] == 0  # 0: run alone with -k, or deselected


# ---- every search mode against the oracle ------------------------------------------------------------

MODE_EXAMPLES = 60
CORPUS = 24


@pytest.fixture(scope="module")
def oracle_index(tmp_path_factory: pytest.TempPathFactory, tiny_encoder):
    index = SearchIndex.open(tmp_path_factory.mktemp("oracle") / "idx", tiny_encoder)
    rng = random.Random(45)
    texts = [" ".join(rng.choice(TINY_WORDS) for _ in range(8)) for _ in range(CORPUS)]
    # One document names every field, so no generated filter is refused as naming an unknown field.
    index.upsert([Document("all-fields", "lighthouse", {name: 0 for name in FIELDS})])
    yield index, texts
    index.close()


@settings(
    max_examples=MODE_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.lists(metadata, min_size=CORPUS, max_size=CORPUS),
    node=filters,
    word=st.sampled_from(QUERY_WORDS),
    seed=st.integers(0, 2**16),
)
def test_every_mode_returns_exactly_the_matching_documents(
    oracle_index, tiny_encoder, rows: list[dict[str, Any]], node: dict[str, Any], word: str, seed: int
) -> None:
    """top_k above the corpus: dense and hybrid return every matching document, BM25 every matching one that
    holds the query's word; a filter applied after ranking would lose some, one not applied would add some."""
    ran["modes"] += 1
    index, texts = oracle_index
    index.upsert([Document(f"doc{i}", texts[i], meta) for i, meta in enumerate(rows)])
    everything = {f"doc{i}": meta for i, meta in enumerate(rows)} | {"all-fields": {n: 0 for n in FIELDS}}
    texts_of = {f"doc{i}": text for i, text in enumerate(texts)} | {"all-fields": "lighthouse"}
    matching = {doc_id for doc_id, meta in everything.items() if holds(meta, node)}
    with_word = {doc_id for doc_id in matching if word in words(texts_of[doc_id])}
    query = np.random.default_rng(seed).standard_normal(tiny_encoder.dimension).astype(np.float32)
    query /= np.linalg.norm(query)
    top_k = CORPUS + 10
    live, selective = index._live, ranking.SELECTIVE_CHUNKS
    # Each plan: the columns' matches scored exactly, the columns' bitmap inside FAISS, and the planner's SQL
    # backend (what answers where the columns cannot: ``Unsupported``).
    try:
        for sql, ranking.SELECTIVE_CHUNKS in ((False, selective), (False, 0), (True, selective)):
            if sql:
                live.columns.select = unsupported
            for mode, expected in (("dense", matching), ("bm25", with_word), ("hybrid", matching)):
                hits = index.search(query, word, top_k=top_k, mode=mode, filters=node)
                assert {h.id for h in hits} == expected, (mode, sql, node)
                assert len(hits) == len(expected), mode  # each document once
    finally:
        ranking.SELECTIVE_CHUNKS = selective
        live.columns.__dict__.pop("select", None)


def unsupported(tree: Any) -> None:
    raise Unsupported("the SQL backend's turn")


def test_modes_oracle_ran_its_examples() -> None:
    print(f"\ntest_every_mode_returns_exactly_the_matching_documents ran {ran['modes']} examples")
    assert ran["modes"] in (MODE_EXAMPLES, 0)


# ---- what the oracle does not generate: refusals --------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"a": {"$gt": "red"}}, "filter.a.$gt"),  # a string that is not a date: never a string comparison
        ({"$or": [{"a": 1}, {"b": {"$lte": "2020-13-01"}}]}, "filter.$or.1.b.$lte"),  # no 13th month
        ({"a": {"$gte": True}}, "filter.a.$gte"),  # a boolean is not a number
        ({"a": {"$gt": [1, 2]}}, "filter.a.$gt"),
        ({"a": {"$regex": "x"}}, "filter.a.$regex"),
        ({"$nor": [{"a": 1}]}, "filter.$nor"),
        ({"$or": []}, "filter.$or"),
        ({"a": {"$in": 3}}, "filter.a.$in"),
        ({"a": {"$exists": 1}}, "filter.a.$exists"),
        ({"a": None}, "filter.a"),
        ({"a": {"$eq": {"k": 1}}}, "filter.a.$eq"),
        ({"a": {}}, "filter.a"),
        ({"a": 2**64}, "filter.a"),
        (
            {"a": {"$gt": "2020-01-01T00:00+15:00"}},
            "filter.a.$gt",
        ),  # an offset SQLite's julianday() cannot read
        ({"a": {"$ne": "2020-01-01 00:00:00-23:59"}}, "filter.a.$ne"),
        ({"$and": [{"a": {"$in": list(range(2000))}}]}, "filter.$and.0.a.$in"),  # values per list
    ],
)
def test_invalid_filters_name_the_field(node: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidFilterValue) as caught:
        parse_filter(node, set(FIELDS))
    assert caught.value.field == field, str(caught.value)


def test_metadata_a_filter_could_never_compare_is_refused_before_it_is_stored() -> None:
    """The same rule for every writer (the service, ``cloze index build`` and ``add``): a date-time whose offset
    SQLite cannot read would be stored but never compare as an instant."""
    check_document(Document("ok", "t", {"when": ["2020-01-01T00:00+14:59", "2020-01-01T00:00-14:59"]}))
    with pytest.raises(InvalidDocument) as caught:
        check_document(Document("late", "t", {"a": [{"when": "2020-01-01T00:00:00+15:00"}]}), "3.")
    assert caught.value.field == "3.metadata" and "+15:00" in str(caught.value)


def test_depth_clauses_and_the_whole_filter_are_bounded() -> None:
    deep: dict[str, Any] = {"a": 1}
    for _ in range(9):
        deep = {"$not": deep}
    with pytest.raises(InvalidFilterValue, match="deeper"):
        parse_filter(deep, set(FIELDS))
    with pytest.raises(InvalidFilterValue, match="clauses"):
        parse_filter({"$and": [{"$or": [{}] * 200}, {"$or": [{}] * 200}]}, set(FIELDS))
    many = {"$or": [{"a": i} for i in range(300)]}
    with pytest.raises(InvalidFilterValue, match="clauses") as caught:
        parse_filter(many, set(FIELDS))
    assert caught.value.field.startswith("filter.$or.")
    with pytest.raises(InvalidFilterValue, match="in all") as caught:
        parse_filter({"a": {"$in": list(range(600))}, "b": {"$nin": list(range(600))}}, set(FIELDS), 1024)
    assert caught.value.field == "filter"


def test_ranges_compare_instants_across_offsets_and_numbers_across_types() -> None:
    rids = backends_select(
        [
            {"when": "2020-01-01T10:00:00+05:00"},  # 05:00Z
            {"when": "2020-01-01T06:00:00"},  # no offset: UTC
            {"when": ["1999-01-01", "2020-01-02"]},
            {"when": "January 2020"},  # not a date: never in a range
            {"when": 2020},  # a number against a date bound: not in the range
            {"n": 2.5},
            {"n": 3},
            {"n": "4"},  # a string against a number bound: not in the range
            {"n": True},
        ]
    )
    assert rids({"when": {"$gte": "2020-01-01T05:30:00Z"}}) == [2, 3]
    # Each operator on its own over a list: 1999 is before 05:30, 2020-01-02 after midnight (MongoDB's rule).
    assert rids({"when": {"$lt": "2020-01-01T05:30:00Z", "$gte": "2020-01-01"}}) == [1, 3]
    assert rids({"when": {"$gte": "2020-01-01T10:00:00+05:00", "$lte": "2020-01-01T05:00Z"}}) == [1, 3]
    assert rids({"n": {"$gt": 2.5}}) == [7] and rids({"n": {"$gte": 2.5, "$lt": 3}}) == [6]
    assert rids({"n": {"$ne": 3}}) == [1, 2, 3, 4, 5, 6, 8, 9]  # the negations match a missing field
    assert rids({"n": {"$exists": True, "$nin": [3, "4"]}}) == [6, 9]
    assert rids({"n": True}) == [9] and rids({"n": 1}) == []  # equality is typed


MOON = ["1969-07-21T20:17:40", "1969-07-21T20:17:40Z", "1969-07-21T22:17:40+02:00", "1969-07-21T20:17:40.000"]


def test_one_rule_for_dates_in_every_operator() -> None:
    """Four spellings of one instant: equality, membership and their negations agree with the range from that
    instant to itself, over the documents' JSON, over the side table and over the columns alike."""
    rids = backends_select(
        [{"when": m} for m in MOON] + [{"when": "1969-07-21T20:17:41Z"}, {"when": "July 1969"}, {}]
    )

    moon = [1, 2, 3, 4]
    for spelling in MOON:
        assert rids({"when": {"$gte": spelling, "$lte": spelling}}) == moon
        assert rids({"when": spelling}) == moon
        assert rids({"when": {"$in": [spelling, "1969-07-21T20:17:41Z"]}}) == [*moon, 5]
        assert rids({"when": {"$ne": spelling}}) == [5, 6, 7]
        assert rids({"when": {"$nin": [spelling]}}) == [5, 6, 7]
    assert rids({"when": "July 1969"}) == [6]  # not an ISO date: compared as text


def test_an_absent_field_matches_nothing_and_its_negations_everything() -> None:
    """MongoDB's reading: a field no document has (or a null range bound) matches nothing; strict callers pass
    the known fields and get ``UnknownFilterField`` instead."""
    rids = backends_select([{"a": i} for i in range(3)])

    assert rids({"ghost": 1}) == [] and rids({"ghost": {"$exists": True}}) == []
    assert (
        rids({"ghost": {"$ne": 1}})
        == rids({"ghost": {"$nin": [1]}})
        == rids({"$not": {"ghost": 1}})
        == [1, 2, 3]
    )
    assert rids({"a": {"$gt": None}}) == rids({"a": {"$lte": None}}) == []
    assert rids({"a": {"$not": {"$gt": None}}}) == [1, 2, 3]
    with pytest.raises(UnknownFilterField, match="ghost") as caught:
        parse_filter({"$or": [{"a": 1}, {"ghost": 1}]}, {"a"})
    assert caught.value.field == "filter.$or.1.ghost"


@pytest.mark.parametrize("few", [8, 0])
def test_equalities_of_many_values_match_the_oracle(few: int, monkeypatch) -> None:
    """Lists past ``FEW_VALUES`` (a code table, np.isin) and within it (one pass per value), also with lists
    and $nin, where the random filters above rarely hold more than one matching value."""
    monkeypatch.setattr(columns_module, "FEW_VALUES", few)
    rows = [
        {
            "tag": f"t{i % 20}",
            "n": i % 13,
            "tags": [f"t{i % 7}", f"t{i % 11}"],
            "x": i % 17 - 8 + (i % 5 == 0) / 2,
        }
        for i in range(80)
    ]
    columns = Columns.load(MemoryStore(metadata_database(rows)))
    for node in (
        {"tag": {"$in": [f"t{i}" for i in range(3, 15)]}},
        {"tag": ["t3", "t5", "missing"]},
        {"tags": {"$nin": ["t1", "t2", "t4", "t6", "t8", "t9", "t10", "t12", "t13"]}},
        {"n": {"$in": [1, 2.0, 3, 5, 7, 8, 9, 11, 12, True]}},
        {"x": {"$in": [-8, -7, -5, -3, 0, 2, 4, 6, 7, 8]}},  # whole numbers: a table of their span
        {"x": {"$in": [-7.5, -2.5, 2.5, 7.5, 1, 2, 3, 4, 5]}},  # fractions: np.isin
        {"n": {"$in": [0, 1, 2, 3, 4, 5, 6, 7, 10**9]}},  # too far apart for a table: np.isin
    ):
        expected = {rid for rid, meta in enumerate(rows, start=1) if holds(meta, node)}
        masked = columns.select(parse_filter(node)).documents
        assert set(np.flatnonzero(masked).tolist()) == expected, (few, node)
        assert 0 < len(expected) < len(rows), node  # the filter splits the rows
