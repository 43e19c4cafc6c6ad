"""The changelog follower: every acknowledged write reaches FAISS and BM25 through the store's changelog.

Why ``remove_ids``/add plus a changelog, not a delta index: SQLite commits first (durable, with vectors),
each commit appends chunk ``+``/``-`` entries to a changelog, and every process applies the changelog
past the sequence its FAISS copy has seen. One mechanism then serves upserts in this process, writes from
other replicas, reopening after a crash (the saved FAISS snapshot records its sequence) and the rebuild's
catch-up. A delta index would need a second search path and a merge on every query; FAISS ``remove_ids``
on IVF / flat indexes is cheap, and HNSW falls back to tombstones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from index.records import Document
from index.storage.columns import Columns
from index.storage.locks import ReadWriteLock
from index.storage.store import DocumentStore
from index.storage.vectors import VectorIndex
from index.storage.version import OpenVersion
from index.text.chunking import Chunk

# Changelog entries between FAISS snapshots; the changelog is pruned behind each. The variable is for the
# crash tests, which need snapshots to happen while they watch.
SNAPSHOT_EVERY = int(os.environ.get("CLOZE_INDEX_SNAPSHOT_EVERY", "10000"))


def apply_changes(version: OpenVersion, lock: ReadWriteLock) -> int:
    """Apply entries past ``applied_seq`` to the version's BM25, FAISS copy and columns (ours and other
    processes' writes). Caller is the index's one mutator; ``snapshot_if_due`` afterwards.

    What changed is read from one snapshot of the store outside the readers' lock, then applied to all three
    together under it: a search sees BM25, FAISS and the columns at one ``applied_seq``, never BM25 postings
    ahead of the columns that mask them."""
    store = version.store
    with store.snapshot():
        lexical = version.lexical.prepare(store)  # committed to tantivy, not yet seen by searches
        through, changes = store.max_seq(), store.changes_since(version.applied_seq)
        final = {chunk_id: op for _, _, chunk_id, op in changes}  # each chunk's last operation
        removed = [i for i, op in final.items() if op == "-"]
        ids, vectors = store.vectors([i for i, op in final.items() if op == "+"], version.vectors.dimension)
        update = Columns.read_changes(store, changes) if changes else None
    with lock.write():
        version.lexical.apply(lexical, store)
        if update is not None:
            if version.replaying:  # add_with_ids does not deduplicate: a replay must not add an id twice
                removed = removed + [int(i) for i in ids]
            version.vectors.remove(removed)
            version.vectors.add(ids, vectors)
            version.columns.apply(update)
        version.applied_seq = max(version.applied_seq, through)  # nothing in between: one state
        version.replaying = False
    return len(changes)


def snapshot_if_due(version: OpenVersion) -> None:
    """Save FAISS once enough changes accumulated since the last save (outside the readers' lock: it only reads)."""
    if version.applied_seq - version.saved_seq >= SNAPSHOT_EVERY:
        version.snapshot()


@dataclass
class ChangeBatch:
    """The documents changed in the changelog's ``(after, through]``, each as it is at ``through``: its chunks
    and stored vectors (an upsert), or gone (a delete). Applied in order, batches replay a version's writes
    without embedding anything again (a rebuild's catch-up, a replica's tail)."""

    after: int
    through: int
    upserts: list[tuple[Document, list[Chunk], np.ndarray | None]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)


def merge_batches(batches: list[ChangeBatch]) -> ChangeBatch:
    """Consecutive batches as one (each document as the last batch holding it has it): applying it gives the
    state the last batch gives, in one transaction instead of one per batch."""
    final: dict[str, tuple[Document, list[Chunk], np.ndarray | None] | None] = {}
    for batch in batches:
        final |= dict.fromkeys(batch.deletes)
        final |= {item[0].id: item for item in batch.upserts}
    merged = ChangeBatch(batches[0].after, batches[-1].through)
    for doc_id, item in final.items():
        if item is None:
            merged.deletes.append(doc_id)
        else:
            merged.upserts.append(item)
    return merged


class ChangelogPruned(RuntimeError):
    """The changelog no longer reaches back to the asked sequence (a FAISS snapshot pruned it)."""


def read_changes(store: DocumentStore, dimension: int, since: int, most: int | None = None) -> ChangeBatch:
    """The documents changed after ``since``, as they are now (``through`` is the last change read). The
    caller keeps writes out meanwhile (the index's mutation lock), so the batch is one state of the store.
    ``most``: more changed documents than this raise ``OverflowError`` (the caller copies files instead)."""
    if since < store.pruned_through():
        raise ChangelogPruned(f"the changelog starts after sequence {store.pruned_through()}, not {since}")
    changes = store.changes_since(since)
    batch = ChangeBatch(since, changes[-1][0] if changes else since)
    doc_ids = list(dict.fromkeys(doc_id for _, doc_id, _, _ in changes))
    if most is not None and len(doc_ids) > most:
        raise OverflowError(f"{len(doc_ids)} documents changed after sequence {since}, over {most}")
    rows, documents = store.chunks_of(doc_ids), store.documents_of(doc_ids)
    for doc_id in doc_ids:
        document = documents.get(doc_id)
        if document is None:
            batch.deletes.append(doc_id)
            continue
        chunks = rows.get(doc_id, [])
        ids, matrix = store.vectors([c.chunk_id for c in chunks], dimension)
        by_id = dict(zip(ids.tolist(), matrix, strict=True))
        stored = [c for c in chunks if c.chunk_id in by_id]
        vectors = np.stack([by_id[c.chunk_id] for c in stored]) if stored else None
        batch.upserts.append((document, [Chunk(c.chunk_index, c.chunk_text, 0) for c in stored], vectors))
    return batch


def write_changes(
    store: DocumentStore,
    vectors: VectorIndex | None,
    batch: ChangeBatch,
    log: bool,
    state: dict[str, str],
) -> None:
    """One transaction: the batch's deletes and upserts (with their vectors) and ``state`` (e.g. a replica's
    position), so a reader sees all of the batch or none of it. ``vectors``: FAISS updated here (a draft's);
    None when the changelog (``log``) carries the changes to FAISS afterwards."""
    with store.transaction() as conn:
        for doc_id in batch.deletes:
            removed = store.delete_document(conn, doc_id, log=log) or []
            if vectors is not None:
                vectors.remove(removed)
        for item in batch.upserts:
            removed, added = store.write_documents(conn, [item], log=log)
            if vectors is not None:
                vectors.remove(removed)
                if item[2] is not None:
                    vectors.add(np.asarray(added, np.int64), item[2])
        for key, value in state.items():
            store.set_state(conn, key, value)


def copy_changes(old: OpenVersion, store: DocumentStore, vectors: VectorIndex, since: int) -> None:
    """Bring a rebuilt version up to date with the writes its source acknowledged after ``since``: each
    changed document is copied as it is now, with its stored vectors (nothing is embedded again)."""
    batch = read_changes(old.store, vectors.dimension, since)
    if batch.upserts or batch.deletes:
        write_changes(store, vectors, batch, log=False, state={})
