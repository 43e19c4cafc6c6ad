"""The values and errors the index hands to its callers (the service, the CLI, evaluation)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Document:
    """A user's document: an id they choose, its text and free-form JSON metadata kept as given."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchHit:
    """One document in a result list; ``chunk`` is the window that matched best (results are per document)."""

    id: str
    score: float
    text: str
    chunk: str
    chunk_index: int
    metadata: dict[str, Any]


class IndexError_(Exception):
    """Base of the index's own errors (named so it does not shadow the builtin ``IndexError``)."""


class IndexModelMismatch(IndexError_):
    """The index was built with another model: its vectors are meaningless to this encoder."""


class UnknownFilterField(IndexError_, ValueError):
    """A filter names a metadata field that no document has (almost always a typo)."""


class ReadOnlyIndex(IndexError_):
    """The index was opened read-only (a replica on a read-only volume): documents change through the indexer."""


class DocumentStoreError(IndexError_):
    """The SQLite store is missing, corrupt or from an incompatible layout."""


class IndexLocked(IndexError_):
    """Another process holds this index's writer lock: one process writes an index at a time."""


class StorageError(IndexError_):
    """The disk refused a write (full, read-only, I/O error). Nothing of the failed write was kept."""

    def __init__(self, message: str, full: bool = False):
        super().__init__(message)
        self.full = full


class DamagedFile(IndexError_):
    """A derived file of a version (the FAISS snapshot or its JSON) is missing or does not read back."""


class LiveWritesDuringBuild(IndexError_):
    """``cloze index build`` would publish over writes the live index acknowledged while it ran."""
