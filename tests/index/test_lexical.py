"""BM25 on tantivy: ranks like FTS5 on real text, follows writes through the changelog (idempotently, so a crash
converges), shows one state per search, yields to FTS5 while it builds."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from index.records import Document
from index.search_index import SearchIndex
from index.storage import lexical as module
from index.storage.lexical import LexicalIndex, indexed_terms
from index.storage.store import DocumentStore
from index.text.chunking import Chunk
from tests.index.conftest import killed


def scifact_documents(shared: Path, count: int) -> list[Document]:
    documents = []
    with gzip.open(shared / "beir-scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            documents.append(Document(record["_id"], f"{record['title']} {record['text']}", {}))
            if len(documents) == count:
                return documents
    return documents


def as_item(document: Document) -> tuple[Document, list[Chunk], None]:
    """One chunk, no vector: the changelog that the index follows records chunks."""
    return document, [Chunk(0, document.text, 0)], None


@pytest.fixture()
def scifact_store(tmp_path: Path, shared_data: Path) -> DocumentStore:
    store = DocumentStore(tmp_path / "documents.sqlite")
    with store.transaction() as conn:
        store.write_documents(conn, [as_item(d) for d in scifact_documents(shared_data, 600)], log=True)
    yield store
    store.close()


def test_ranks_like_fts5_on_real_text(scifact_store: DocumentStore, shared_data: Path) -> None:
    lexical = LexicalIndex()  # a temporary folder
    lexical.build(scifact_store)
    assert lexical.ready
    with (shared_data / "beir-scifact" / "queries.jsonl").open() as handle:
        queries = [json.loads(line)["text"] for line in handle][:50]
    agree = overlap = 0
    for query in queries:
        ours, theirs = lexical.search(query, 10), scifact_store.bm25(query, 10)
        assert [s for _, s in ours] == sorted((s for _, s in ours), reverse=True)
        agree += bool(ours) and bool(theirs) and ours[0][0] == theirs[0][0]
        overlap += len({d for d, _ in ours} & {d for d, _ in theirs})
    # Same formula and constants; only the stemmers differ (Snowball here, Porter in FTS5).
    assert agree >= 40, agree
    assert overlap >= 0.8 * 10 * len(queries), overlap


def test_follows_writes_through_the_changelog(scifact_store: DocumentStore) -> None:
    lexical = LexicalIndex()
    lexical.build(scifact_store)
    with scifact_store.transaction() as conn:
        scifact_store.write_documents(
            conn, [as_item(Document("new", "zebrafish xylophones quantified", {}))], log=True
        )
        scifact_store.delete_document(conn, "4983", log=True)  # the first SciFact abstract
    assert lexical.search("xylophones", 5) == []  # not yet synced
    assert lexical.sync(scifact_store) == 2
    assert [d for d, _ in lexical.search("xylophones zebrafish", 5)][0] == "new"
    assert "4983" not in {d for d, _ in lexical.search("microstructural development human newborn", 50)}
    assert lexical.sync(scifact_store) == 0


def test_search_index_uses_it_unfiltered_and_fts5_filtered(tmp_path: Path, tiny_encoder) -> None:
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        index.upsert([Document("a", "the king plays guitar", {"color": "red"})])
        index.upsert([Document("b", "the queen reads a book", {"color": "blue"})])
        live = index._live
        assert (
            index.wait_for_lexical(30) and live.lexical.seq == live.store.max_seq()
        )  # synced by the upserts
        assert [h.id for h in index.search(None, "guitar", mode="bm25")] == ["a"]
        assert [h.id for h in index.search(None, "book", mode="bm25", filters={"color": "blue"})] == ["b"]
        assert index.search(None, "book", mode="bm25", filters={"color": "red"}) == []
        index.delete("a")
        assert index.search(None, "guitar", mode="bm25") == []
    finally:
        index.close()


def test_terms_are_our_snowball_stems_and_stopwords_count_in_length(tmp_path: Path) -> None:
    assert indexed_terms("The cats were RUNNING to a café") == "- cat - run - - café"
    store = DocumentStore(tmp_path / "documents.sqlite")
    with store.transaction() as conn:
        short = Document("short", "runner runs", {})
        long = Document("long", "runs " + "and the of " * 20, {})  # the same stem, diluted by stopwords
        store.write_documents(
            conn, [as_item(short), as_item(long), as_item(Document("x", "other", {}))], log=True
        )
    lexical = LexicalIndex(tmp_path / "lexical")
    lexical.build(store)
    assert [d for d, _ in lexical.search("running", 5)] == ["short", "long"]
    assert lexical.search("the and of", 5) == []  # stopwords are never query terms
    assert lexical.search("-", 5) == []  # nor is the stopwords' placeholder
    lexical.stop()
    store.close()


def change(store: DocumentStore) -> None:
    with store.transaction() as conn:
        store.write_documents(
            conn, [as_item(Document("new", "zebrafish xylophones quantified", {}))], log=True
        )
        store.write_documents(
            conn, [as_item(Document("4983", "xylophones replaced the abstract", {}))], log=True
        )
        store.delete_document(conn, "5836", log=True)


def state(lexical: LexicalIndex) -> tuple[int, list, list]:
    return (
        lexical.documents,
        lexical.search("xylophones zebrafish", 10),
        lexical.search("microstructural development human newborn", 20),
    )


def test_a_replay_after_a_crash_converges(scifact_store: DocumentStore, tmp_path: Path) -> None:
    """Changes past the sidecar's sequence (held, not committed, when the process died) are replayed on open:
    deleted and added again, never doubled."""
    folder = tmp_path / "lexical"
    lexical = LexicalIndex(folder)
    lexical.build(scifact_store)
    built_at = lexical.seq
    change(scifact_store)
    assert lexical.sync(scifact_store) == 3
    expected = state(lexical)
    assert expected[0] == 600 and expected[1][0][0] == "new" and "4983" in {d for d, _ in expected[1]}
    lexical.stop()  # no save: the sidecar still says ``built_at``

    reopened = LexicalIndex(folder)
    assert reopened.seq == built_at and reopened.start(scifact_store) is None and reopened.ready
    assert reopened.sync(scifact_store) == 3  # the same three documents, again
    assert state(reopened) == expected
    reopened.stop()  # a second crash, the same way
    third = LexicalIndex(folder)
    assert third.start(scifact_store) is None and third.sync(scifact_store) == 3 and state(third) == expected
    assert third.save() == scifact_store.max_seq()  # committed now
    third.stop()
    again = LexicalIndex(folder)
    assert again.seq == scifact_store.max_seq() and again.start(scifact_store) is None
    assert alike(state(again), expected)  # scored by tantivy now, not from the held counts
    again.stop()


def alike(got: tuple[int, list, list], expected: tuple[int, list, list]) -> bool:
    """The same documents, found by the same queries, with close scores: held documents count in the statistics
    that score committed ones only once committed (and tantivy rounds lengths)."""
    return got[0] == expected[0] and all(
        {d for d, _ in a} == {d for d, _ in b}
        and [s for _, s in a] == pytest.approx([s for _, s in b], rel=0.1)
        for a, b in zip(got[1:], expected[1:], strict=True)
    )


def test_a_damaged_or_stale_index_is_built_again(scifact_store: DocumentStore, tmp_path: Path) -> None:
    folder = tmp_path / "lexical"
    lexical = LexicalIndex(folder)
    lexical.build(scifact_store)
    expected = lexical.search("microstructural development human newborn", 10)
    lexical.stop()
    (folder / "meta.json").write_text("{ not json")
    damaged = LexicalIndex(folder)
    assert damaged.start(scifact_store) is not None and damaged.wait(60)
    assert damaged.search("microstructural development human newborn", 10) == expected
    damaged.stop()
    change(scifact_store)
    scifact_store.prune_changelog(
        scifact_store.max_seq()
    )  # the sidecar's point is no longer in the changelog
    stale = LexicalIndex(folder)
    assert stale.start(scifact_store) is not None and stale.wait(60) and stale.seq == scifact_store.max_seq()
    assert stale.search("xylophones zebrafish", 1)[0][0] == "new"
    stale.stop()


def test_a_search_sees_one_commit_until_the_next_is_handed_over(scifact_store: DocumentStore) -> None:
    """``prepare`` commits outside the index's write lock; searches keep the state at ``seq`` (and ``at=``
    refuses any other point) until ``apply`` hands the new searcher over."""
    lexical = LexicalIndex()
    lexical.build(scifact_store)
    before = lexical.seq
    change(scifact_store)
    with scifact_store.snapshot():
        pending = lexical.prepare(scifact_store)
    assert pending is not None and pending.since == before
    assert lexical.search("xylophones", 5, at=before) == []  # committed, not yet seen
    assert lexical.search("xylophones", 5, at=pending.through) is None  # not at that point yet
    assert lexical.apply(pending, scifact_store) == 3
    assert lexical.search("xylophones", 5, at=before) is None
    assert {d for d, _ in lexical.search("xylophones", 5, at=pending.through)} == {"new", "4983"}
    lexical.stop()


def same(got: list[tuple[str, float]], expected: list[tuple[str, float]]) -> bool:
    return [d for d, _ in got] == [d for d, _ in expected] and [s for _, s in got] == pytest.approx(
        [s for _, s in expected]
    )


def test_a_filter_ranks_its_matches_alone_broad_or_selective(scifact_store: DocumentStore) -> None:
    """Both ways a mask applies (a deeper top list kept where it matches, the query restricted to its rows)
    give the unfiltered ranking's order among the matches, with the same scores."""
    lexical = LexicalIndex()
    lexical.build(scifact_store)
    rids = dict(scifact_store.query("SELECT id, rid FROM documents"))
    size = max(rids.values()) + 1
    query = "cells protein expression in human disease"
    everything = lexical.search(query, 600)
    for every in (1, 2, 10, 50, 300):  # 100% .. 0.3% of the documents
        rows = (np.arange(size) % every) == 0
        expected = [hit for hit in everything if rows[rids[hit[0]]]][:10]
        assert same(lexical.search(query, 10, rows=rows), expected), every
    only = [d for d, _ in everything[5:8]]
    assert same(lexical.search(query, 10, only=only), everything[5:8])
    assert lexical.search(query, 10, rows=np.zeros(size, bool)) == []
    lexical.stop()


def test_the_temporary_copy_is_removed_and_nothing_restarts_after_stop(scifact_store: DocumentStore) -> None:
    lexical = LexicalIndex()
    assert lexical.start(scifact_store) is not None and lexical.wait(60)
    folder = lexical.folder
    assert (folder / module.SYNCED).exists()
    lexical.stop()
    assert not folder.exists() and lexical.start(scifact_store) is None


def test_a_failed_commit_leaves_faiss_going_and_is_retried(tmp_path: Path, tiny_encoder, monkeypatch) -> None:
    """A commit tantivy refuses (a full disk) must not stop FAISS and the columns: BM25 answers from FTS5 while
    the index is built again."""
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        assert index.wait_for_lexical(60)  # a new collection's index is built in the background
        index.upsert([Document("a", "the king plays guitar", {})])
        live = index._live
        assert live.lexical.seq == live.applied_seq == 1
        real, refusals = module._document, []

        def refused_once(*args):
            if not refusals:
                refusals.append(args)
                raise ValueError("No space left on device")
            return real(*args)

        monkeypatch.setattr(module, "_document", refused_once)
        index.upsert([Document("b", "the queen plays violin", {})])  # the failure starts a build again
        assert refusals and live.applied_seq == live.store.max_seq() and index.stats()["vectors"] == 2
        assert [h.id for h in index.search(None, "violin", mode="bm25")] == ["b"]  # FTS5 or the new build
        assert index.wait_for_lexical(60)
        index.upsert([Document("c", "a drummer plays drums", {})])
        index.upsert([Document("d", "a singer", {})])
        assert live.lexical.seq == live.applied_seq
        assert [h.id for h in index.search(None, "violin", mode="bm25")] == ["b"]
        assert live.lexical.search("plays", 10, at=live.applied_seq) is not None
        assert {d for d, _ in live.lexical.search("plays", 10)} == {"a", "b", "c"}
        assert live.lexical.documents == 4
    finally:
        index.close()


def test_held_changes_are_committed_in_one_go(scifact_store: DocumentStore, monkeypatch) -> None:
    """Writes do not wait for a tantivy commit: changed documents are held (scored beside the committed index,
    their stale copies left out) until ``COMMIT_EVERY`` of them are, then committed together."""
    monkeypatch.setattr(module, "COMMIT_EVERY", 4)
    lexical = LexicalIndex()
    lexical.build(scifact_store)
    change(scifact_store)  # three documents
    assert lexical.sync(scifact_store) == 3 and len(lexical._view.held) == 3
    held = lexical.search("xylophones", 5)
    assert {d for d, _ in held} == {"new", "4983"} and lexical.documents == 600
    with scifact_store.transaction() as conn:
        scifact_store.write_documents(conn, [as_item(Document("more", "xylophones again", {}))], log=True)
    assert lexical.sync(scifact_store) == 1 and lexical._view.held == {}  # four: committed
    assert {d for d, _ in lexical.search("xylophones", 5)} == {"new", "4983", "more"}
    assert lexical.documents == 601
    lexical.stop()


def test_closing_commits_the_held_writes(tmp_path: Path, tiny_encoder, monkeypatch) -> None:
    monkeypatch.setattr(
        module, "_commit_due", lambda held, committed: False
    )  # a small collection commits early
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    assert index.wait_for_lexical(60)
    index.upsert([Document("a", "the king plays guitar", {}), Document("b", "the queen reads", {})])
    live = index._live
    assert set(live.lexical._view.held) == {"a", "b"}
    index.close()
    synced = json.loads((live.folder / module.FOLDER / module.SYNCED).read_text())
    assert synced["synced_seq"] == 2
    reopened = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        assert reopened.wait_for_lexical(0) and reopened._live.lexical._view.held == {}  # nothing replayed
        assert [h.id for h in reopened.search(None, "guitar", mode="bm25")] == ["a"]
    finally:
        reopened.close()


def test_held_documents_score_as_they_will_once_committed(tmp_path: Path, monkeypatch) -> None:
    """Held documents (here all of them: the committed index is empty) score as tantivy scores them once
    committed (a replica restored from a base has them committed), so a writer and its replica rank alike."""
    monkeypatch.setattr(module, "_commit_due", lambda held, committed: False)
    store = DocumentStore(tmp_path / "documents.sqlite")
    lexical = LexicalIndex(tmp_path / "lexical")
    lexical.build(store)
    texts = ["the cat sat on the mat", "a dog and a cat", "guitar music for the dog", "france is a country"]
    with store.transaction() as conn:
        store.write_documents(
            conn, [as_item(Document(f"d{i}", t, {})) for i, t in enumerate(texts)], log=True
        )
    assert lexical.sync(store) == 4 and len(lexical._view.held) == 4
    held = lexical.search("cat dog guitar", 10)
    assert lexical.save() == store.max_seq() and lexical._view.held == {}
    assert same(lexical.search("cat dog guitar", 10), held)
    lexical.stop()
    store.close()


def test_faiss_rebuilt_at_open_keeps_the_bm25_index(tmp_path: Path, tiny_encoder, monkeypatch) -> None:
    """Repairing FAISS at open saves a snapshot and prunes the changelog before BM25 starts: the prune must
    stop at BM25's saved point, or the index on disk would be built again for nothing."""
    monkeypatch.setattr(module, "_commit_due", lambda held, committed: False)
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    assert index.wait_for_lexical(60)
    index.upsert([Document("a", "the king plays guitar", {})])
    folder = index._live.folder
    index.close()
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)  # held writes replayed: none
    index.upsert([Document("b", "the queen plays violin", {})])  # held, not committed: the crash loses it
    killed(index)  # what tantivy's writer held is never committed
    (folder / "vectors.faiss").write_bytes(b"damaged")
    reopened = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        lexical = reopened._live.lexical
        assert lexical._builder is None and lexical.ready  # opened from disk, then replayed
        assert lexical.seq == reopened._live.applied_seq
        assert [h.id for h in reopened.search(None, "violin", mode="bm25")] == ["b"]
    finally:
        reopened.close()


def test_a_small_collection_commits_early(tmp_path: Path) -> None:
    """Held documents more than half as many as the committed ones are committed at once: their statistics
    would otherwise move the ranking against a copy that has them committed."""
    assert module._commit_due(1, 0) and module._commit_due(6, 11) and not module._commit_due(6, 12)
    assert module._commit_due(module.COMMIT_EVERY, 10**6) and not module._commit_due(255, 10**6)


def test_documents_replaced_again_and_again_are_all_found(tmp_path: Path) -> None:
    """Replaced copies stay in tantivy's document frequencies until a merge: a held document's term could count
    in more documents than the collection holds, and its score then fell below zero (dropped from answers)."""
    store = DocumentStore(tmp_path / "documents.sqlite")
    texts = {f"d{i}": f"lighthouse keeper number {i}" for i in range(24)}

    def write(ids: list[str]) -> None:
        with store.transaction() as conn:
            store.write_documents(conn, [as_item(Document(i, texts[i], {})) for i in ids], log=True)

    write(list(texts))
    lexical = LexicalIndex(tmp_path / "lexical")
    lexical.build(store)
    rng = random.Random(0)
    for _ in range(30):
        write(rng.sample(list(texts), 4))
        lexical.sync(store)
        assert len(lexical.search("lighthouse", 30)) == 24
    lexical.stop()
    store.close()


@pytest.mark.parametrize(
    ("widened", "depth"), [(True, module.TIE_DEPTH), (False, module.TIE_DEPTH), (False, 1)]
)
def test_ties_rank_alike_in_every_copy_whatever_the_order_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, widened: bool, depth: int
) -> None:
    """Copies holding the same documents in another order (a replica's base, a rebuild) cut a tie at the same
    place: tantivy's own order is the index's, so a replica answered another document at 5th (CI, test_loopback).
    A filter's matches too, whichever way its mask applies (a widened list, or the query restricted to them);
    ``depth`` 1: a first search too short for the tie, read again deeper."""
    monkeypatch.setattr(module, "widens", lambda pool, matched: widened)
    monkeypatch.setattr(module, "TIE_DEPTH", depth)
    texts = {f"d{i:02d}": "lighthouse keeper" if i % 3 else "lighthouse keeper lamp" for i in range(30)}
    answers = []
    for copy, order in enumerate(
        (sorted(texts), sorted(texts, reverse=True), random.Random(1).sample(list(texts), 30))
    ):
        store = DocumentStore(tmp_path / f"copy{copy}.sqlite")
        with store.transaction() as conn:
            store.write_documents(conn, [as_item(Document(i, texts[i], {})) for i in order], log=True)
        lexical = LexicalIndex(tmp_path / f"lexical{copy}")
        lexical.build(store)
        rows = np.zeros(31, dtype=bool)  # a filter's matches, the even documents, by their rids here
        for doc_id, rid in store.query("SELECT id, rid FROM documents"):
            rows[rid] = int(doc_id[1:]) % 2 == 0
        answers.append(
            [lexical.search("lighthouse lamp", k) for k in (1, 5, 12)]
            + [lexical.search("keeper", 5, rows=rows), store.bm25("keeper", 5)]
        )
        lexical.stop()
        store.close()
    assert answers[0] == answers[1] == answers[2]
    assert [d for d, _ in answers[0][1]] == ["d00", "d03", "d06", "d09", "d12"]  # the lamp's ten, by id
    assert [d for d, _ in answers[0][2]][10:] == ["d01", "d02"]
    assert [d for d, _ in answers[0][3]] == ["d02", "d04", "d08", "d10", "d14"]  # 20 tied; the even, by id


def test_a_sync_overtaken_while_it_reads_reads_again(tmp_path: Path) -> None:
    """Two syncs at once (a write's and a build's last one): the one that reads while the other shows a newer
    state reads again from there; it used to drop its changes, and BM25 stayed on FTS5 until the next write."""
    store = DocumentStore(tmp_path / "documents.sqlite")
    lexical = LexicalIndex(tmp_path / "lexical")
    lexical.build(store)

    def write(doc_id: str, text: str) -> None:
        with store.transaction() as conn:
            store.write_documents(conn, [as_item(Document(doc_id, text, {}))], log=True)

    write("a", "the king plays guitar")
    with store.snapshot():
        first = lexical.prepare(store)  # the other sync: staged, not yet shown
    write("b", "the queen plays violin")
    changes_since = store.changes_since

    def overtaken(since: int) -> list:
        found = changes_since(since)
        if first is not None and lexical.seq < first.through:
            lexical.apply(first, store)  # shown while this sync reads
        return found

    store.changes_since = overtaken
    assert lexical.sync(store) == 1 and lexical.seq == store.max_seq()
    assert [d for d, _ in lexical.search("violin guitar", 5)] == ["a", "b"]
    lexical.stop()
    store.close()
