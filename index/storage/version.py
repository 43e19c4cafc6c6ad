"""One opened, published version: its store, its FAISS copy, its BM25 index (tantivy, in the version's
folder), and how far the changelog has been applied to them."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from index.records import DamagedFile, IndexModelMismatch, StorageError
from index.storage import layout, lexical
from index.storage.columns import Columns, Selection, Unsupported
from index.storage.filters import TESTED_PER_MATCH
from index.storage.lexical import LexicalIndex
from index.storage.store import DocumentStore
from index.storage.vectors import VectorIndex, build_vectors

log = logging.getLogger(__name__)


Repair = Callable[[str], None]  # told the reason of each repair (the service counts them in a metric)


def report_repair(on_repair: Repair | None, reason: str, detail: str) -> None:
    """Every self-repair of the index leaves a log line and, through the hook, a metric."""
    log.warning("index repaired (%s): %s", reason, detail)
    if on_repair is not None:
        on_repair(reason)


class OpenVersion:
    def __init__(self, root: Path, number: int, read_only: bool = False, on_repair: Repair | None = None):
        self.number = number
        self.read_only = read_only
        self.on_repair = on_repair
        self.folder = layout.version_dir(root, number)
        manifest = layout.read_manifest_safely(self.folder)
        if manifest is None:
            raise FileNotFoundError(f"index version {self.folder} has no readable manifest")
        self.manifest = manifest
        self.store = DocumentStore(self.folder / layout.STORE, create=False, read_only=read_only)
        self.pins: list[int] = []  # changelog points a running rebuild still needs
        self.saved_seq = 0
        # The version's folder belongs to its writer: a read-only process keeps a private copy.
        self.lexical = LexicalIndex(None if read_only else self.folder / lexical.FOLDER)
        try:
            self.vectors, meta = VectorIndex.load(self.folder / layout.VECTORS)
            self.applied_seq = self.saved_seq = int(meta.get("synced_seq", 0))
            if self.applied_seq < self.store.pruned_through():  # e.g. a restored backup of the snapshot
                self.rebuild_vectors(
                    "stale-snapshot", f"FAISS snapshot of {self.folder} predates the changelog"
                )
            elif self.applied_seq > self.store.max_seq():
                self.rebuild_vectors(
                    "snapshot-ahead", f"FAISS snapshot of {self.folder} is newer than its store"
                )
        except DamagedFile as exc:
            self.rebuild_vectors("damaged-vectors", str(exc))
        # The first replay after opening may meet entries the snapshot already holds: it removes before adding.
        self.replaying = True
        self.columns = Columns.load(self.store)  # filterable metadata in memory, following the changelog
        self.columns_enabled = True  # False: filters are planned over SQLite alone (benchmarks compare both)
        self.lexical.start(self.store)

    def rebuild_vectors(self, reason: str, detail: str) -> None:
        """FAISS again from the store's vectors (the store is the source of truth; nothing is re-embedded),
        saved at once by a writer so the next open is cheap."""
        report_repair(self.on_repair, reason, f"{detail}: rebuilt from the store")
        dimension, factory = int(self.manifest["dimension"]), self.manifest.get("factory")
        try:
            self.vectors = build_vectors(self.store, dimension, factory)
        except ValueError:  # e.g. fewer vectors left than an IVF factory's lists: exact search is right then
            self.vectors = build_vectors(self.store, dimension, None)
        self.applied_seq = self.store.max_seq()
        self.saved_seq = -1
        self.snapshot()

    def verify(self) -> None:
        """FAISS and SQLite must agree once the changelog is replayed: as many vectors as stored chunk vectors."""
        stored, held = self.store.count_vectors(), self.vectors.ntotal
        if stored != held:
            self.rebuild_vectors(
                "count-mismatch", f"{self.folder}: FAISS holds {held} vectors, the store {stored}"
            )

    def select(self, filters: dict[str, Any] | None) -> Selection | None:
        """A filter's matches from the in-memory columns (SQL's rows where the columns cannot answer exactly);
        None without a filter, or with the columns switched off."""
        if not filters or not self.columns_enabled:
            return None
        return self.matches(filters)

    def matches(self, filters: dict[str, Any]) -> Selection:
        """The documents matching ``filters`` (every one for ``{}``), from the columns where they answer."""
        try:
            return self.columns.select(filters)
        except Unsupported:
            where, params = self.store.filter_sql(filters)
            rows = self.store.query(f"SELECT d.rid FROM documents d WHERE {where}", params)
            documents = np.zeros(self.columns.size, bool)
            documents[[r[0] for r in rows if r[0] < self.columns.size]] = True
            return Selection(self.columns, documents)

    def bm25(
        self, text: str, limit: int, filters: dict[str, Any] | None, selection: Selection | None = None
    ) -> list[tuple[str, float]]:
        """On tantivy when built (a filter: its matches masked in, from the columns; without them, its best
        candidates tested, or its matches listed and ranked alone); FTS5 until then (same ranking function,
        same constants), and while the in-memory copy is at another changelog point than the columns and FAISS
        (a build that just finished, before it replays the writes it missed): one state per search."""
        found = self._in_memory_bm25(text, limit, filters, selection) if self.lexical.ready else None
        return self.store.bm25(text, limit, filters) if found is None else found

    def _in_memory_bm25(
        self, text: str, limit: int, filters: dict[str, Any] | None, selection: Selection | None
    ) -> list[tuple[str, float]] | None:
        at = self.applied_seq
        if not filters:
            return self.lexical.search(text, limit, at=at)
        if selection is not None:
            return self.lexical.search(text, limit, rows=selection.documents, at=at)
        if limit <= 0:
            return None
        found = self._post_filtered_bm25(text, limit, filters)
        if found is not None:
            return found
        return self.lexical.search(text, limit, self.store.filtered_document_ids(filters), at=at)

    def _post_filtered_bm25(
        self, text: str, limit: int, filters: dict[str, Any]
    ) -> list[tuple[str, float]] | None:
        """A broad filter (``store.match_rate``): the in-memory ranking's best, those of matching documents
        kept; the same as ranking the matches when ``limit`` of them are kept, or when the pool held every
        document with a query term. None for a selective filter: its matches are listed instead (the side
        table's indexes), as ``ranking.post_filtered`` decides for dense search."""
        rate = self.store.match_rate(filters)
        deepest = TESTED_PER_MATCH * rate * self.lexical.documents
        first = pool = int(1.5 * limit / rate) + 1 if rate else 0
        if not rate or pool > deepest:
            return None
        while True:
            found = self.lexical.search(text, pool, at=self.applied_seq)
            if found is None:
                return None
            keep = self.store.matching_documents([doc_id for doc_id, _ in found], filters)
            kept = [hit for hit in found if hit[0] in keep]
            if len(kept) >= limit or len(found) < pool:
                return kept[:limit]
            deeper = int(1.5 * limit * len(found) / max(len(kept), 1))
            if not kept or deeper > deepest or pool > first:
                return None
            pool = deeper

    def snapshot(self) -> None:
        """Save FAISS as of ``applied_seq`` and BM25's position, then prune the changelog behind both (and
        behind any rebuild's pin).

        Bounds both the changelog's size and the replay after a crash. Never raises: a snapshot that the
        disk refuses only means a longer replay next time (the changelog is kept). Caller is the writer."""
        if self.read_only or self.applied_seq <= self.saved_seq or not self.folder.is_dir():
            return
        if self.applied_seq < self.store.pruned_through():
            return  # another process pruned past us: our copy is stale, its snapshot is the newer one
        layout.pause_for_tests("snapshot-start")
        try:
            self.vectors.save(
                self.folder / layout.VECTORS, {"synced_seq": self.applied_seq}, stage="snapshot"
            )
        except OSError as exc:
            log.warning(
                "could not save the FAISS snapshot of %s (the changelog is kept): %s", self.folder, exc
            )
            return
        self.saved_seq = self.applied_seq
        lexical_seq = (
            self.lexical.save()
        )  # None: BM25 needs no changelog (it is built again at the next open)
        kept = [self.saved_seq, *self.pins, *([] if lexical_seq is None else [lexical_seq])]
        try:
            self.store.prune_changelog(min(kept))
        except (StorageError, sqlite3.Error) as exc:
            log.warning("could not prune the changelog of %s: %s", self.folder, exc)

    def close(self, save: bool) -> None:
        if save:  # a fresher snapshot makes the next open cheaper; the changelog makes it optional
            self.snapshot()
            self.lexical.save()  # BM25's held writes committed: nothing of them to replay at the next open
        self.lexical.stop()
        self.store.close()


def check_model(manifest: dict[str, Any], encoder: Any, root: Path) -> None:
    """Refuse an encoder other than the one the version was built with: its vectors would be meaningless."""
    if (
        manifest.get("model_fingerprint") != encoder.info.fingerprint
        or manifest.get("dimension") != encoder.dimension
    ):
        raise IndexModelMismatch(
            f"index {root} was built with model {manifest.get('model_id')!r} (fingerprint "
            f"{manifest.get('model_fingerprint')}, dimension {manifest.get('dimension')}), but the encoder is "
            f"{encoder.info.model_id!r} (fingerprint {encoder.info.fingerprint}, dimension {encoder.dimension}); "
            "rebuild the index with this model or start the service with the index's model"
        )
