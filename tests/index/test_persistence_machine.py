"""Random interleavings of what one writer's index lives through: upserts and deletes, snapshots (FAISS, the
columns and tantivy's commit), rebuilds, clean restarts and kills between saves, some in the middle of a snapshot.
After every step, and so after each reopen, the filter columns must answer as the store's SQL does, tantivy's
BM25 must find exactly the documents holding a query word's stem, and a deleted document must appear nowhere
(hypothesis' stateful testing: its shrinker reports the shortest sequence of steps that breaks one of these)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from index.records import Document
from index.search_index import SearchIndex
from index.storage.columns import Columns
from index.storage.filters import parse_filter
from index.storage.lexical import LexicalIndex
from index.storage.store import DocumentStore
from index.text.analysis import stemmer, words
from tests.index.conftest import killed

IDS = [f"d{i}" for i in range(6)]
# "plays" and "playing" share the query word "play"'s stem; "the" and "of" only lengthen a document.
TEXT_WORDS = ["cat", "dog", "river", "king", "queen", "music", "book", "plays", "playing", "the", "of"]
QUERY_WORDS = ["cat", "river", "king", "play", "music", "book"]
FILTERS: list[dict[str, Any]] = [
    {"color": "red"},
    {"color": {"$in": ["green", "blue"]}},
    {"rank": {"$gte": 1}},
    {"rank": {"$lt": 0.5}},
    {"flag": True},
    {"flag": {"$ne": True}},
    {"mixed": {"$exists": True}},
    {"mixed": 1},
    {"$or": [{"color": "red"}, {"flag": False}]},
    {"$not": {"rank": {"$gt": -1}}},
]

metadata = st.fixed_dictionaries(
    {},
    optional={  # each field may be missing
        "color": st.sampled_from(["red", "green", "blue"]),
        "rank": st.one_of(st.integers(-2, 3), st.sampled_from([-0.5, 0.5, 2.25])),
        "flag": st.booleans(),
        "mixed": st.one_of(st.sampled_from(["1", "red"]), st.integers(0, 2), st.booleans()),
    },
)
documents = st.builds(
    Document,
    st.sampled_from(IDS),
    st.lists(st.sampled_from(TEXT_WORDS), min_size=1, max_size=8).map(" ".join),
    metadata,
)


class Killed(Exception):
    """Raised where a snapshot is cut short: the process dies there."""


def stems_of(text: str) -> set[str]:
    return set(stemmer().stemWords(words(text)))


class IndexLifecycle(RuleBasedStateMachine):
    encoder: Any = None  # the tiny encoder, set by the test

    @initialize()
    def open_an_empty_index(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="cloze-machine-"))
        self.root = self.folder / "idx"
        self.repairs: list[str] = []  # a crash is mended by replaying the changelog, never by a repair
        self.index = self.opened()
        self.model: dict[str, Document] = {}  # what was acknowledged

    def opened(self) -> SearchIndex:
        return SearchIndex.open(self.root, self.encoder, on_repair=self.repairs.append)

    def teardown(self) -> None:
        if hasattr(self, "index"):
            self.index.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    # ---- steps -----------------------------------------------------------------------------------------

    @rule(batch=st.lists(documents, min_size=1, max_size=3))
    def upsert(self, batch: list[Document]) -> None:
        self.index.upsert(batch)
        self.model |= {document.id: document for document in batch}  # the last of a repeated id wins

    @rule(doc_id=st.sampled_from(IDS))
    def delete(self, doc_id: str) -> None:
        assert self.index.delete(doc_id) == (self.model.pop(doc_id, None) is not None)

    @rule()
    def snapshot(self) -> None:
        with self.index._mutate:
            self.index._live.snapshot()

    @rule()
    def rebuild(self) -> None:
        """A new version from the store's rows: its columns saved with it, its BM25 built in the background."""
        self.index.rebuild()

    @rule()
    def close_and_reopen(self) -> None:
        self.index.close()
        self.index = self.opened()

    @rule()
    def kill_and_reopen(self) -> None:
        killed(self.index)  # whatever was written since the last snapshot is replayed from the changelog
        self.index = self.opened()

    @rule(where=st.sampled_from(["before the columns", "before BM25", "before the prune"]))
    def kill_during_a_snapshot(self, where: str) -> None:
        """FAISS saved, the rest of the snapshot not: each save must be replayed from its own point."""
        target, name = {
            "before the columns": (Columns, "save"),
            "before BM25": (LexicalIndex, "save"),
            "before the prune": (DocumentStore, "prune_changelog"),
        }[where]
        real = target.__dict__[name]

        def dies(*args: Any, **kwargs: Any) -> None:
            raise Killed(where)

        setattr(target, name, dies)
        try:
            with self.index._mutate:
                self.index._live.snapshot()
        except Killed:
            pass  # not raised when the snapshot had nothing to save past FAISS: killed after it then
        finally:
            setattr(target, name, real)
        self.kill_and_reopen()

    # ---- what must hold after every step ---------------------------------------------------------------

    @invariant()
    def the_store_holds_what_was_acknowledged(self) -> None:
        assert self.repairs == []
        index = self.index
        assert {doc_id: index.get(doc_id) for doc_id in IDS} == {i: self.model.get(i) for i in IDS}
        stats = index.stats()
        assert stats["documents"] == len(self.model) and stats["vectors"] == stats["chunks"]

    @invariant()
    def the_columns_answer_as_the_store(self) -> None:
        live = self.index._live
        for node in FILTERS:
            tree = parse_filter(node)
            chosen = live.columns.select(tree).documents
            where, params = live.store.filter_sql(tree)
            by_sql = live.store.query(f"SELECT d.rid FROM documents d WHERE {where}", params).fetchall()
            assert set(np.flatnonzero(chosen).tolist()) == {rid for (rid,) in by_sql}, node
        alive = np.flatnonzero(live.columns.alive[: live.columns.size]).tolist()
        rids = live.store.query("SELECT rid FROM documents").fetchall()
        assert sorted(alive) == sorted(rid for (rid,) in rids)  # a deleted document's row is dead

    @invariant()
    def bm25_finds_exactly_the_documents_holding_each_stem(self) -> None:
        assert self.index.wait_for_lexical(60)
        live = self.index._live
        assert live.lexical.ready and live.lexical.seq == live.store.max_seq()
        rows = live.store.query("SELECT id, text FROM documents").fetchall()
        for word in QUERY_WORDS:
            stem = stemmer().stemWord(word)
            expected = {doc_id for doc_id, text in rows if stem in stems_of(text)}
            hits = live.lexical.search(word, len(IDS) + 1)
            assert hits is not None and {doc_id for doc_id, _ in hits} == expected, word
            assert all(score > 0 for _, score in hits)

    @invariant()
    def dense_search_finds_only_live_documents(self) -> None:
        vector = self.encoder.embed(["cat river king"], normalize=True)[0]
        found = {hit.id for hit in self.index.search(vector, "", top_k=len(IDS) + 1)}
        assert found == set(self.model)


@pytest.mark.slow
def test_random_writes_saves_restarts_and_kills_keep_columns_and_bm25_equal_to_the_store(
    tiny_encoder,
) -> None:
    IndexLifecycle.encoder = tiny_encoder
    run_state_machine_as_test(
        IndexLifecycle,
        settings=settings(
            max_examples=12,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
