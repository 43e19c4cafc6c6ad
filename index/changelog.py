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

import numpy as np

from index.chunking import Chunk
from index.columns import Columns
from index.locks import ReadWriteLock
from index.store import DocumentStore
from index.vectors import VectorIndex
from index.version import OpenVersion

# Changelog entries between FAISS snapshots; the changelog is pruned behind each. The variable is for the
# crash tests, which need snapshots to happen while they watch.
SNAPSHOT_EVERY = int(os.environ.get("CLOZE_INDEX_SNAPSHOT_EVERY", "10000"))


def apply_changes(version: OpenVersion, lock: ReadWriteLock) -> int:
    """Apply entries past ``applied_seq`` to the version's BM25 and FAISS copy (ours and other processes'
    writes); snapshot when enough have accumulated. Caller is the index's one mutator."""
    version.lexical.sync(version.store)
    changes = version.store.changes_since(version.applied_seq)
    if not changes:
        version.replaying = False
        return 0
    final: dict[int, str] = {}
    for _, _, chunk_id, op in changes:
        final[chunk_id] = op
    removed = [i for i, op in final.items() if op == "-"]
    ids, vectors = version.store.vectors(
        [i for i, op in final.items() if op == "+"], version.vectors.dimension
    )
    if version.replaying:  # add_with_ids does not deduplicate: a replay must not add an id twice
        removed = removed + [int(i) for i in ids]
    update = Columns.read_changes(version.store, changes)
    with lock.write():
        version.vectors.remove(removed)
        version.vectors.add(ids, vectors)
        version.columns.apply(update)
        version.applied_seq = changes[-1][0]
        version.replaying = False
    if version.applied_seq - version.saved_seq >= SNAPSHOT_EVERY:
        version.snapshot()
    return len(changes)


def copy_changes(old: OpenVersion, store: DocumentStore, vectors: VectorIndex, since: int) -> None:
    """Bring a rebuilt version up to date with the writes its source acknowledged after ``since``: each
    changed document is copied as it is now, with its stored vectors (nothing is embedded again)."""
    doc_ids = list(dict.fromkeys(doc_id for _, doc_id, _, _ in old.store.changes_since(since)))
    if not doc_ids:
        return
    rows = old.store.chunks_of(doc_ids)
    with store.transaction() as conn:
        for doc_id in doc_ids:
            document = old.store.get(doc_id)
            if document is None:
                vectors.remove(store.delete_document(conn, doc_id, log=False) or [])
                continue
            chunks = rows.get(doc_id, [])
            ids, matrix = old.store.vectors([c.chunk_id for c in chunks], vectors.dimension)
            by_id = dict(zip(ids.tolist(), matrix, strict=True))
            stored = [c for c in chunks if c.chunk_id in by_id]
            item = (
                document,
                [Chunk(c.chunk_index, c.chunk_text, 0) for c in stored],
                np.stack([by_id[c.chunk_id] for c in stored]) if stored else None,
            )
            removed, added = store.write_documents(conn, [item], log=False)
            vectors.remove(removed)
            if stored and item[2] is not None:
                vectors.add(np.asarray(added, np.int64), item[2])
