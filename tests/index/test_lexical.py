"""The in-memory BM25: ranks like FTS5 on real text, follows writes through the changelog, yields to FTS5."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from index.records import Document
from index.search_index import SearchIndex
from index.storage.lexical import LexicalIndex
from index.storage.store import DocumentStore
from index.text.chunking import Chunk


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
    lexical = LexicalIndex()
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


def test_a_search_leaves_no_hold_on_the_arrays_writes_grow(scifact_store: DocumentStore, monkeypatch) -> None:
    """A search that fails midway keeps its frame alive in the traceback, past the lock: if its locals were
    views of the index's arrays, every later write failed with BufferError, half-applied (issue 42's soak)."""
    import numpy as np

    from index.storage import lexical as module

    lexical = LexicalIndex()
    lexical.build(scifact_store)
    real_log = np.log

    def failing_log(value):
        raise RuntimeError("a search that fails after reading the arrays")

    monkeypatch.setattr(module.np, "log", failing_log)
    with pytest.raises(RuntimeError) as kept:  # pytest keeps the exception and its frames
        lexical.search("microstructural development human newborn", 5)
    monkeypatch.setattr(module.np, "log", real_log)
    with scifact_store.transaction() as conn:
        scifact_store.write_documents(
            conn, [as_item(Document("later", "zebrafish xylophones quantified", {}))], log=True
        )
    assert lexical.sync(scifact_store) == 1
    assert [d for d, _ in lexical.search("xylophones", 5)] == ["later"]
    assert kept.value is not None
