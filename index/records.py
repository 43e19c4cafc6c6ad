"""The values and errors the index hands to its callers (the service, the CLI, evaluation)."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, NamedTuple

MAX_ID_CHARS = 512
MAX_METADATA_KEY_CHARS = 256


def id_problem(doc_id: str) -> str | None:
    """Why a document id could not round-trip through the API (None when it can): every search mode, ``GET``
    and ``DELETE /documents/{id}`` must find what was stored under it."""
    if not doc_id.strip():
        return "empty or only whitespace"
    if len(doc_id) > MAX_ID_CHARS:
        return f"{len(doc_id)} characters, over the limit of {MAX_ID_CHARS}"
    if control := _control_character(doc_id):
        return f"contains the control character {control}"
    if any(segment in (".", "..") for segment in doc_id.split("/")):
        return "a '.' or '..' path segment (HTTP clients rewrite them, so the id could not be read back)"
    return None


MAX_COLLECTION_NAME_CHARS = 64
# Lower-case ASCII letters, digits, '-' and '_', starting with a letter or digit: no '/', '..', NUL, control
# or look-alike characters, and no two names that a case-insensitive file system would make one folder.
COLLECTION_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


def collection_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a collection (a folder under the data root), or None."""
    if not name:
        return "empty"
    if len(name) > MAX_COLLECTION_NAME_CHARS:
        return f"{len(name)} characters, over the limit of {MAX_COLLECTION_NAME_CHARS}"
    if not COLLECTION_NAME.fullmatch(name):
        return "use lower-case letters a-z, digits, '-' and '_', starting with a letter or a digit"
    return None


def metadata_key_problem(key: str) -> str | None:
    """Why a metadata key could not be stored and filtered on exactly (None when it can): SQLite's JSON paths
    cannot name a key with a quote or a backslash, and a NUL ends a string in SQLite's C API."""
    if not key:
        return "an empty key"
    if len(key) > MAX_METADATA_KEY_CHARS:
        return f"a key of {len(key)} characters, over the limit of {MAX_METADATA_KEY_CHARS}"
    if control := _control_character(key):
        return f"a key containing the control character {control}"
    if '"' in key or "\\" in key:
        return f"the key {key!r} contains a double quote or a backslash"
    return None


# SQLite's julianday() reads UTC offsets up to +-14:59 (real ones stop at +14:00) and answers NULL past them:
# such a date-time would be stored, but never compare as an instant (its ranges match nothing, $ne everything).
DATE_TIME_WITH_OFFSET = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?[+-](\d{2}:\d{2})")
MAX_UTC_OFFSET = "14:59"


def date_problem(text: str) -> str | None:
    """Why a date-time string could not be compared as an instant by every plan, SQLite's included (None
    when it can, or when it is no date-time)."""
    match = DATE_TIME_WITH_OFFSET.fullmatch(text)
    if match and match[1] > MAX_UTC_OFFSET:
        return f"the date-time {text!r} has a UTC offset past +-{MAX_UTC_OFFSET}, which SQLite cannot compare"
    return None


def _control_character(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) == "Cc":
            return f"U+{ord(char):04X}"
    return None


@dataclass
class Document:
    """A user's document: an id they choose, its text and free-form JSON metadata kept as given."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


class Landed(NamedTuple):
    """A committed write: durable in the store; ``searchable`` once FAISS, BM25 and the filter columns hold it
    too (False: applying it failed, and the next write, poll or open replays it)."""

    upserted: int
    searchable: bool


@dataclass
class SearchHit:
    """One document in a result list; ``chunk`` is the window that matched best (results are per document)."""

    id: str
    score: float
    text: str
    chunk: str
    chunk_index: int
    metadata: dict[str, Any]
    highlights: list[tuple[int, int]] | None = None  # [start, end) in ``chunk`` of query terms, when asked
    explanation: Any = None  # ``ranking.Explanation`` when asked: where the hit stood in each list


class IndexError_(Exception):
    """Base of the index's own errors (named so it does not shadow the builtin ``IndexError``)."""


class IndexModelMismatch(IndexError_):
    """The index was built with another model: its vectors are meaningless to this encoder."""


class InvalidDocument(IndexError_, ValueError):
    """A document whose id or metadata keys could not round-trip (``id_problem``, ``metadata_key_problem``)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def check_document(doc: Document, where: str = "") -> None:
    """Refuse, before anything is stored, a document that could not be read back as it was written, or whose
    metadata a filter could not compare (``date_problem``)."""
    if problem := id_problem(doc.id):
        raise InvalidDocument(f"{where}id {doc.id[:80]!r}: {problem}", f"{where}id")
    stack: list[Any] = [doc.metadata]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                if problem := metadata_key_problem(key):
                    raise InvalidDocument(f"{where}metadata: {problem}", f"{where}metadata")
                stack.append(child)
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and (problem := date_problem(node)):
            raise InvalidDocument(f"{where}metadata: {problem}", f"{where}metadata")


class UnknownFilterField(IndexError_, ValueError):
    """A filter names a metadata field that no document has (almost always a typo). ``field`` is where it
    was named, as ``filter.<path>`` (``filter.$or.1.year``)."""

    def __init__(self, message: str, field: str = "filter"):
        super().__init__(message)
        self.field = field


class InvalidCursor(IndexError_, ValueError):
    """A listing cursor this index did not hand out (cursors are opaque: pass back ``next_cursor`` as is)."""


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
