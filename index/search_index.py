"""``SearchIndex``: the object the service holds. Dense, BM25 and hybrid search over one published version,
durable incremental updates, background rebuilds and pickup of versions published elsewhere.

The jobs live in their own files: ``version`` (one opened version), ``changelog`` (how writes reach FAISS
and BM25), ``ranking`` (dense ranking and fusion), ``results`` (hit assembly), ``builder`` (making and
publishing a version). This file holds the lifecycle and the locking that ties them together.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from index import layout
from index.builder import BuildOptions, VersionDraft, embed_documents
from index.changelog import apply_changes, copy_changes
from index.chunking import Chunker
from index.locks import ReadWriteLock
from index.ranking import dense_ranking, fusion_depth, reciprocal_rank_fusion
from index.records import Document, ReadOnlyIndex, SearchHit
from index.results import assemble_hits
from index.vectors import VectorIndex
from index.version import OpenVersion, check_model

log = logging.getLogger(__name__)
Mode = Literal["dense", "bm25", "hybrid"]


class SearchIndex:
    def __init__(self, root: Path, encoder: Any, version: OpenVersion):
        self.root = Path(root)
        self.encoder = encoder
        self._live = version
        self._chunkers: dict[int | None, Chunker] = {}
        self._rw = ReadWriteLock()
        self._mutate = threading.RLock()  # one writer at a time: SQLite commit + FAISS catch-up

    # ---- lifecycle ----------------------------------------------------------------------------------

    @classmethod
    def open(cls, root: Path, encoder: Any, *, create: bool = True, read_only: bool = False) -> SearchIndex:
        """``read_only``: for replicas on a read-only volume; SQLite is opened immutable, nothing is written
        there, and a version's changes become visible when the indexer publishes the next version."""
        root = Path(root)
        number = layout.current_version(root)
        if number is None:
            if not create or read_only:
                raise FileNotFoundError(f"no published index in {root}")
            number = _create_empty(root, encoder)
        manifest = layout.read_manifest(layout.version_dir(root, number)) or {}
        check_model(manifest, encoder, root)
        index = cls(root, encoder, OpenVersion(root, number, read_only))
        with index._mutate:
            index._catch_up()
        return index

    @property
    def chunker(self) -> Chunker:
        """Chunks new documents the way the live version was built (its manifest's overlap)."""
        overlap = self._live.manifest.get("build", {}).get("chunk_overlap")
        if overlap not in self._chunkers:  # a tokenizer copy each: made once per overlap, not per upsert
            self._chunkers[overlap] = Chunker.for_encoder(self.encoder, overlap)
        return self._chunkers[overlap]

    def wait_for_lexical(self, timeout: float | None = None) -> bool:
        """Until the in-memory BM25 is built (FTS5 answers meanwhile): for runs that must score one ranker."""
        return self._live.lexical.wait(timeout)

    def _require_writable(self) -> None:
        if self._live.read_only:
            raise ReadOnlyIndex(f"index {self.root} is open read-only: change documents through the indexer")

    def close(self) -> None:
        with self._mutate, self._rw.write():
            self._live.close(save=True)

    @property
    def manifest(self) -> dict[str, Any]:
        return self._live.manifest | self.stats()

    def stats(self) -> dict[str, int]:
        live = self._live
        return live.store.counts() | {"vectors": live.vectors.ntotal}

    def metadata_fields(self) -> set[str]:
        self._live.store.refresh_fields()
        return self._live.store.fields()

    def get(self, doc_id: str) -> Document | None:
        return self._live.store.get(doc_id)

    def reload_if_changed(self) -> bool:
        """Cheap (one small file, one indexed query): adopt a newly published version, or replay new changes."""
        number = layout.current_version(self.root)
        if number is not None and number != self._live.number:
            manifest = layout.read_manifest(layout.version_dir(self.root, number)) or {}
            check_model(manifest, self.encoder, self.root)
            fresh = OpenVersion(self.root, number, self._live.read_only)
            with self._mutate:
                old = self._swap(fresh)
                self._catch_up()
            old.close(save=False)
            return True
        with self._mutate:
            return self._catch_up() > 0

    def _swap(self, fresh: OpenVersion) -> OpenVersion:
        with self._rw.write():
            old, self._live = self._live, fresh
        return old

    def _catch_up(self) -> int:
        """Replay the changelog onto the live version. Caller holds _mutate."""
        live = self._live
        if live.applied_seq < live.store.pruned_through():  # another writer pruned what we had not applied
            log.info("changelog pruned past this copy of version %s: reloading it", live.number)
            self._swap(OpenVersion(self.root, live.number, live.read_only)).close(save=False)
        return apply_changes(self._live, self._rw)

    # ---- updates ------------------------------------------------------------------------------------

    def upsert(self, docs: list[Document]) -> int:
        """Embed (outside any lock), commit to SQLite (durable), then apply to FAISS (searchable)."""
        self._require_writable()
        unique = list({d.id: d for d in docs}.values())  # last one wins, as sequential upserts would
        items = embed_documents(self.encoder, self.chunker, unique)
        with self._mutate:
            store = self._live.store
            with store.transaction() as conn:
                store.write_documents(conn, items, log=True)
            self._catch_up()
        return len(unique)

    def delete(self, doc_id: str) -> bool:
        self._require_writable()
        with self._mutate:
            store = self._live.store
            with store.transaction() as conn:
                removed = store.delete_document(conn, doc_id, log=True)
            self._catch_up()
        return removed is not None

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Re-embed every document into a new version with the live version's build options; searches and
        writes continue on the old one meanwhile.

        Writes acknowledged during the rebuild are in the old store's changelog past the snapshot sequence;
        they are copied (with their vectors) into the new version under the writer lock, just before the swap.
        """
        self._require_writable()
        with layout.build_lock(self.root):
            with self._mutate:
                old = self._live
                snapshot_seq = old.store.max_seq()
                old.pins.append(snapshot_seq)  # snapshots must not prune what copy_changes will read
            options = BuildOptions.reproducing(old.manifest, show_progress=False)
            try:
                with VersionDraft(self.root, layout.next_version(self.root), self.encoder, options) as draft:
                    draft.fill(old.store.iter_documents(), progress)
                    vectors = draft.build_vectors()
                    with self._mutate:
                        copy_changes(old, draft.store, vectors, snapshot_seq)
                        manifest = draft.finish(vectors)
                        draft.store.close()
                        draft.publish()
                        self._swap(OpenVersion(self.root, draft.number, self._live.read_only))
            finally:
                with self._mutate:
                    old.pins.remove(snapshot_seq)
        old.close(save=False)
        return manifest

    # ---- search -------------------------------------------------------------------------------------

    def search(
        self,
        query_vector: np.ndarray | None,
        query_text: str,
        *,
        top_k: int = 10,
        mode: Mode = "dense",
        filters: dict[str, Any] | None = None,
    ) -> list[SearchHit]:
        if mode not in ("dense", "bm25", "hybrid"):
            raise ValueError(f"unknown search mode {mode!r} (dense, bm25 or hybrid)")
        if mode != "bm25" and query_vector is None:
            raise ValueError(f"mode {mode!r} needs a query vector")
        if top_k <= 0:
            return []
        with self._rw.read():
            live = self._live
            filters = filters or None
            if filters:
                live.store.filter_sql(filters)  # raises UnknownFilterField early, whatever the mode
            if mode == "dense":
                ranked = dense_ranking(live, query_vector, top_k, filters)
                return assemble_hits(live, ranked[:top_k], query_vector, query_text)
            if mode == "bm25":
                scored = live.bm25(query_text, top_k, filters)
                return assemble_hits(live, [(d, s, None) for d, s in scored], None, query_text)
            depth = fusion_depth(top_k)
            dense = dense_ranking(live, query_vector, depth, filters)
            sparse = live.bm25(query_text, depth, filters)
            fused = reciprocal_rank_fusion([[(d, c) for d, _, c in dense], [(d, None) for d, _ in sparse]])
            return assemble_hits(live, fused[:top_k], query_vector, query_text)


def _create_empty(root: Path, encoder: Any) -> int:
    """An empty, published version 1 (exact index), so a service can start before any build."""
    with layout.build_lock(root):
        existing = layout.current_version(root)
        if existing is not None:
            return existing
        options = BuildOptions(show_progress=False)
        with VersionDraft(root, layout.next_version(root), encoder, options) as draft:
            draft.finish(VectorIndex.create("IDMap2,Flat", encoder.dimension))
            draft.publish()
        return draft.number
