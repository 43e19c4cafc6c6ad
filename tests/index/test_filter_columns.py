"""The in-memory columns against the SQL path: random metadata, random writes and deletes, random filters; the
writer's columns (kept by its own writes), a replica's (kept by the changelog replay), columns loaded afresh
(a rebuild's, a restore's) and the writer's saved to files and mapped back must select exactly the documents SQL selects, and facets must count what they hold."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from index.records import Document
from index.search_index import SearchIndex
from index.storage import columns as columns_module
from index.storage.columns import Columns
from index.storage.filters import julianday, parse_filter
from tests.index.test_filter_oracle import DATES, FIELDS, elements, filters, holds, metadata

EXAMPLES = 40
ran = {"columns": 0}
operations = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.integers(0, 15), metadata),
        st.tuples(st.just("delete"), st.integers(0, 15), st.none()),
    ),
    min_size=1,
    max_size=8,
)


@pytest.fixture(scope="module")
def writer_and_replica(tmp_path_factory: pytest.TempPathFactory, tiny_encoder):
    root = tmp_path_factory.mktemp("columns") / "idx"
    writer = SearchIndex.open(root, tiny_encoder)
    writer.upsert([Document("seed", "lighthouse", {})])
    replica = SearchIndex.open(root, tiny_encoder, read_only=True)
    yield writer, replica
    replica.close()
    writer.close()


def selected_ids(index: SearchIndex, columns: Columns, node: dict[str, Any]) -> set[str]:
    store = index._live.store
    rows = columns.select(parse_filter(node)).documents
    names = dict(store.query("SELECT rid, id FROM documents").fetchall())
    return {names[int(r)] for r in np.flatnonzero(rows)}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations, nodes=st.lists(filters, min_size=1, max_size=4))
def test_columns_select_what_sql_selects_through_writes_and_deletes(
    writer_and_replica, monkeypatch, ops: list[tuple], nodes: list[dict[str, Any]]
) -> None:
    ran["columns"] += 1
    monkeypatch.setattr(columns_module, "MAPPED_BYTES", 0)  # every saved array mapped, however small
    writer, replica = writer_and_replica
    for op, number, meta in ops:
        if op == "upsert":
            writer.upsert([Document(f"doc{number}", f"text {number}", meta)])
        else:
            writer.delete(f"doc{number}")
    replica.reload_if_changed()
    store = writer._live.store
    fresh = Columns.load(store)
    saved = writer._live.folder.parent.parent / "saved-columns"  # beside the versions, never opened as one
    saved.mkdir(exist_ok=True)
    writer._live.columns.save(saved, store.max_seq())
    mapped, _ = Columns.open(saved)
    stored = {d.id: d.metadata for d in store.iter_documents()}
    for node in nodes:
        where, params = store.filter_sql(parse_filter(node))
        expected = {r[0] for r in store.query(f"SELECT d.id FROM documents d WHERE {where}", params)}
        assert expected == {doc_id for doc_id, meta in stored.items() if holds(meta, node)}, node
        assert selected_ids(writer, writer._live.columns, node) == expected, ("writer", node)
        assert selected_ids(writer, replica._live.columns, node) == expected, ("replica", node)
        assert selected_ids(writer, fresh, node) == expected, ("fresh", node)
        assert selected_ids(writer, mapped, node) == expected, ("saved and mapped", node)
        facets = writer.facets(node, FIELDS, top=100)
        for name in FIELDS:
            assert facets["fields"][name]["values"] == expected_counts(stored, expected, name), (node, name)
        assert facets["total"] == len(expected)


def expected_counts(stored: dict[str, dict], chosen: set[str], name: str) -> list[dict[str, Any]]:
    """Each value's documents (a document once per value; 1 and 1.0 one number, as equality has it), most first,
    ties by number (numbers first, by magnitude), then the value's text then its type: the facets' order."""
    counts: Counter = Counter()
    shown: dict = {}
    for doc_id in chosen:
        keys = set()
        for element in elements(stored[doc_id], name):
            if isinstance(element, bool | str):
                key = (type(element).__name__, element)
                shown[key] = element
            elif isinstance(element, int | float):
                key = ("number", float(element))
                shown[key] = int(element) if float(element).is_integer() else float(element)
            else:
                continue  # null: present, but no value to count
            keys.add(key)
        counts.update(keys)
    order = sorted(
        counts,
        key=lambda k: (-counts[k], k[0] != "number", k[1] if k[0] == "number" else 0, str(shown[k]), k[0]),
    )
    return [{"value": shown[key], "count": counts[key]} for key in order]


def test_columns_ran_their_examples() -> None:
    print(f"\ntest_columns_select_what_sql_selects_through_writes_and_deletes ran {ran['columns']} examples")
    assert ran["columns"] in (EXAMPLES, 0)


def test_wide_integers_and_dates_fall_back_or_compare_as_sqlite(tmp_path, tiny_encoder) -> None:
    """An integer past 2**53 is answered by SQL (a float64 column would round it); a date operand is an instant
    computed by SQLite itself, as in the SQL path."""
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        index.upsert(
            [
                Document("big", "one", {"n": 2**60 + 1, "when": DATES[0]}),
                Document("near", "two", {"n": 2**60, "when": DATES[1]}),
            ]
        )
        query = np.ones(tiny_encoder.dimension, np.float32) / np.sqrt(tiny_encoder.dimension)
        for mode in ("dense", "bm25", "hybrid"):
            hits = index.search(query, "one two", top_k=5, mode=mode, filters={"n": 2**60 + 1})
            assert [h.id for h in hits] == ["big"], mode
        same_instant = index.search(query, "", top_k=5, filters={"when": DATES[1]})
        assert {h.id for h in same_instant} == {"big", "near"}  # DATES[0] and [1] are one instant
        assert julianday("2020-01-01T00:00:00.000") == julianday(DATES[0])
    finally:
        index.close()


def test_a_selection_made_before_a_write_ignores_the_write_s_chunks(tmp_path, tiny_encoder) -> None:
    """A replica searching while its follower applies a write: the write's chunks point at rows past the
    selection's mask (an IndexError here once answered a hybrid search 500); they are simply not selected."""
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        columns = index._live.columns
        for i in range(12):  # one write at a time: the chunk map grows in place between its resizes
            index.upsert([Document(f"d{i}", f"text {i}", {"color": "blue"})])
            selection = columns.select(parse_filter({"color": "blue"}))
            index.upsert([Document(f"n{i}", f"later {i}", {"color": "blue"})])
            assert columns.size > len(selection.documents)  # the write grew the rows under the selection
            assert selection.chunk_count == 2 * i + 1 and len(selection.chunk_ids()) == 2 * i + 1
    finally:
        index.close()


def test_facet_numbers_tied_on_count_sort_by_magnitude_not_text(tmp_path, tiny_encoder) -> None:
    """Years with one document each read 20, 25, 40, 45, 180 (their text's order put 180 first); a number more
    frequent still leads, and texts tied with numbers follow them. Wide integers (counted from the store) too."""
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        years = [180, 45, 20, 40, 25, 9.5]
        index.upsert([Document(f"y{year}", "text", {"year": year}) for year in years])
        index.upsert([Document("again", "text", {"year": 45}), Document("word", "text", {"year": "10"})])
        values = index.facets(None, ["year"], top=10)["fields"]["year"]["values"]
        assert [v["value"] for v in values] == [45, 9.5, 20, 25, 40, 180, "10"]
        index.upsert([Document(f"w{i}", "text", {"wide": 2**60 + i}) for i in (11, 2, 100)])
        wide = index.facets(None, ["wide"], top=10)["fields"]["wide"]["values"]
        assert [v["value"] for v in wide] == [2**60 + 2, 2**60 + 11, 2**60 + 100]
    finally:
        index.close()
