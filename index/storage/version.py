"""One opened, published version: its store, its FAISS copy, its filter columns, its BM25 index (tantivy, in the
version's folder), and how far the changelog has been applied to them."""

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
from index.storage.filters import Filter
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
        self.columns_seq = -1  # the changelog point of the saved columns (-1: none saved)
        # Until the first replay FAISS and the columns may hold different changelog points: it removes before
        # adding, and no snapshot saves the columns meanwhile.
        self.replaying = True
        self.opened = False  # FAISS and the columns both opened
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
        self.columns = self._open_columns()  # filterable metadata, following the changelog
        self.opened = True
        self.lexical.start(self.store)

    def _open_columns(self) -> Columns:
        """The saved columns, mapped, with ``applied_seq`` lowered to their point so the replay brings FAISS and
        them to one state; from the store when none were saved or they cannot serve (repaired, logged)."""
        try:
            columns, seq = Columns.open(self.folder)
        except FileNotFoundError:  # a version saved before the columns' files: the writer saves them at open
            log.info("no saved columns in %s: reading them from the store", self.folder)
            return Columns.load(self.store)
        except DamagedFile as exc:
            return self._reload_columns("damaged-columns", str(exc))
        if seq < self.store.pruned_through():
            return self._reload_columns(
                "stale-columns", f"the columns of {self.folder} predate the changelog"
            )
        if seq > self.store.max_seq():
            return self._reload_columns(
                "columns-ahead", f"the columns of {self.folder} are newer than its store"
            )
        self.applied_seq = min(self.applied_seq, seq)
        self.columns_seq = seq
        return columns

    def _reload_columns(self, reason: str, detail: str) -> Columns:
        report_repair(self.on_repair, reason, f"{detail}: read from the store")
        self.columns_seq = -1
        return Columns.load(self.store)

    def rebuild_vectors(self, reason: str, detail: str) -> None:
        """FAISS again from the store's vectors (the store is the source of truth; nothing is re-embedded),
        saved at once by a writer so the next open is cheap."""
        report_repair(self.on_repair, reason, f"{detail}: rebuilt from the store")
        dimension, factory = int(self.manifest["dimension"]), self.manifest.get("factory")
        try:
            self.vectors = build_vectors(self.store, dimension, factory)
        except ValueError:  # e.g. fewer vectors left than an IVF factory's lists: exact search is right then
            self.vectors = build_vectors(self.store, dimension, None)
        if self.opened:  # the columns stay at ``applied_seq``: the next replay brings FAISS back to them
            self.replaying = True
        else:  # opening: the columns, opened next, replay from their own point if it is older
            self.applied_seq = self.store.max_seq()
        self.saved_seq = -1
        self.snapshot()

    def verify(self) -> None:
        """FAISS, the columns and SQLite must agree once the changelog is replayed: as many vectors as stored
        chunk vectors, as many live document rows and mapped chunks as stored documents and chunks. A writer
        then saves columns it had to read from the store, so the next open maps them."""
        counts = self.store.counts()  # index-only counts: the vector blobs are not read
        stored = counts["chunks"] - self.store.count_pending()  # chunks with a vector
        held = self.vectors.ntotal
        if stored != held:
            self.rebuild_vectors(
                "count-mismatch", f"{self.folder}: FAISS holds {held} vectors, the store {stored}"
            )
        documents = int(np.count_nonzero(self.columns.alive[: self.columns.size]))
        chunks = int(np.count_nonzero(self.columns.chunk_row))
        if (documents, chunks) != (counts["documents"], counts["chunks"]):
            detail = f"{self.folder}: the columns hold {documents} documents and {chunks} chunks, the store {counts}"
            self.columns = self._reload_columns("columns-mismatch", detail)
        if self.columns_seq < 0 and not self.replaying and not self.read_only:
            self._save_columns()

    def select(self, tree: Filter | None) -> Selection | None:
        """The planner: a parsed filter's matches, from the in-memory columns (from SQL's rows where the columns
        cannot answer exactly, ``Unsupported``); None without a filter. Every search mode and facets consume it."""
        if tree is None:
            return None
        try:
            return self.columns.select(tree)
        except Unsupported:
            where, params = self.store.filter_sql(tree)
            rows = self.store.query(f"SELECT d.rid FROM documents d WHERE {where}", params)
            documents = np.zeros(self.columns.size, bool)
            documents[[r[0] for r in rows if r[0] < self.columns.size]] = True
            return Selection(self.columns, documents, tree)

    def bm25(self, text: str, limit: int, selection: Selection | None) -> list[tuple[str, float]]:
        """On tantivy when built (a filter: its matches masked in); FTS5 until then (same ranking function,
        same constants, the filter as SQL), and while tantivy's copy is at another changelog point than the
        columns and FAISS (a build that just finished, before it replays the writes it missed): one state per
        search."""
        if self.lexical.ready:
            rows = None if selection is None else selection.documents
            found = self.lexical.search(text, limit, rows=rows, at=self.applied_seq)
            if found is not None:
                return found
        return self.store.bm25(text, limit, None if selection is None else selection.filter)

    def snapshot(self) -> None:
        """Save FAISS as of ``applied_seq`` and BM25's position, then prune the changelog behind both (and
        behind any rebuild's pin).

        Bounds both the changelog's size and the replay after a crash. Never raises: a snapshot that the
        disk refuses only means a longer replay next time (the changelog is kept). Caller is the writer."""
        columns_due = not self.replaying and self.applied_seq > self.columns_seq
        if self.read_only or not self.folder.is_dir():
            return
        if self.applied_seq <= self.saved_seq and not columns_due:
            return
        if self.applied_seq < self.store.pruned_through():
            return  # another process pruned past us: our copy is stale, its snapshot is the newer one
        layout.pause_for_tests("snapshot-start")
        if self.applied_seq > self.saved_seq:
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
        if columns_due:
            self._save_columns()
        lexical_seq = self.lexical.save()  # None: BM25 keeps no changelog (built again at the next open)
        # What the next open replays from: the oldest saved point (columns never saved: kept for them too).
        kept = [self.saved_seq, self.columns_seq, *self.pins, *([] if lexical_seq is None else [lexical_seq])]
        through = min(kept)
        try:
            if through > 0:
                self.store.prune_changelog(through)
        except (StorageError, sqlite3.Error) as exc:
            log.warning("could not prune the changelog of %s: %s", self.folder, exc)

    def _save_columns(self) -> None:
        """Save the columns as of ``applied_seq`` and map them again from the new files (letting go of the
        pages written since the last save). Caller is the writer, between replays."""
        try:
            self.columns.save(self.folder, self.applied_seq)
            self.columns = self.columns.remapped(self.folder)
        except (OSError, ValueError) as exc:
            log.warning("could not save the columns of %s (the changelog is kept): %s", self.folder, exc)
            return
        self.columns_seq = self.applied_seq

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
