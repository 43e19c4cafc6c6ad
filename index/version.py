"""One opened, published version: its store, its FAISS copy, its in-memory BM25, and how far the changelog
has been applied to them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from index import layout
from index.builder import build_vectors
from index.lexical import LexicalIndex
from index.records import IndexModelMismatch
from index.store import DocumentStore
from index.vectors import VectorIndex

log = logging.getLogger(__name__)


class OpenVersion:
    def __init__(self, root: Path, number: int, read_only: bool = False):
        self.number = number
        self.read_only = read_only
        self.folder = layout.version_dir(root, number)
        manifest = layout.read_manifest(self.folder)
        if manifest is None:
            raise FileNotFoundError(f"index version {self.folder} has no manifest")
        self.manifest = manifest
        self.store = DocumentStore(self.folder / layout.STORE, create=False, read_only=read_only)
        self.vectors, meta = VectorIndex.load(self.folder / layout.VECTORS)
        self.applied_seq = int(meta.get("synced_seq", 0))
        if self.applied_seq < self.store.pruned_through():  # e.g. a crash between the two snapshot files
            log.warning(
                "FAISS snapshot of %s predates the pruned changelog: rebuilt from the store", self.folder
            )
            self.vectors = build_vectors(self.store, self.vectors.dimension, self.vectors.factory)
            self.applied_seq = self.store.max_seq()
        self.saved_seq = self.applied_seq
        self.pins: list[int] = []  # changelog points a running rebuild still needs
        self.lexical = LexicalIndex()
        self.lexical.start(self.store)

    def bm25(self, text: str, limit: int, filters: dict[str, Any] | None) -> list[tuple[str, float]]:
        """In memory when built and unfiltered; FTS5 otherwise (same ranking function, same constants)."""
        if self.lexical.ready and not filters:
            return self.lexical.search(text, limit)
        return self.store.bm25(text, limit, filters)

    def snapshot(self) -> None:
        """Save FAISS as of ``applied_seq``, then prune the changelog behind it (and behind any rebuild's pin).

        Bounds both the changelog's size and the replay after a crash. Caller holds the writer lock."""
        if self.read_only or self.applied_seq <= self.saved_seq or not self.folder.is_dir():
            return
        if self.applied_seq < self.store.pruned_through():
            return  # another process pruned past us: our copy is stale, its snapshot is the newer one
        try:
            self.vectors.save(self.folder / layout.VECTORS, {"synced_seq": self.applied_seq})
        except OSError as exc:
            log.warning("could not save the FAISS snapshot of %s: %s", self.folder, exc)
            return
        self.saved_seq = self.applied_seq
        self.store.prune_changelog(min([self.saved_seq, *self.pins]))

    def close(self, save: bool) -> None:
        if save:  # a fresher snapshot makes the next open cheaper; the changelog makes it optional
            self.snapshot()
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
