"""The values and errors the index hands to its callers (the service, the CLI, evaluation)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

MAX_ID_CHARS = 512
MAX_METADATA_KEY_CHARS = 256
INT64 = (-(2**63), 2**63 - 1)
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode's control characters (category Cc), all of them


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


@dataclass(frozen=True)
class DocumentLimits:
    """How large one document may be: the service's ``CLOZE_MAX_DOCUMENT_CHARS`` and ``CLOZE_MAX_METADATA_*``
    (their defaults are these). An upsert and a restore's import check a document against the same ones."""

    max_document_chars: int = 1_000_000
    max_metadata_bytes: int = 16_384
    max_metadata_depth: int = 8
    max_metadata_keys: int = 256


def text_problem(text: str, limits: DocumentLimits, required: bool) -> str | None:
    """Why a document's text cannot be stored (None when it can). ``required``: a model's collection embeds
    the text, so it needs one; a collection of the caller's own vectors keeps text only to search by words."""
    if required and not text.strip():
        return "empty or only whitespace"
    if len(text) > limits.max_document_chars:
        return f"{len(text)} characters, over the limit of {limits.max_document_chars}"
    return None


def check_metadata(metadata: Any, where: str, limits: DocumentLimits) -> None:
    """``InvalidDocument`` naming the path of what makes ``metadata`` unfit to store: not a JSON object, nested
    past the depth limit, too many keys or bytes, a key that cannot be filtered on, an integer past 64 bits,
    a number that is not finite, a string that is not UTF-8 (a lone surrogate) or a date-time no filter can
    compare (``date_problem``). Iterative, so a document
    nested thousands of levels deep is refused rather than crashing the walk: such a document, once
    stored, answered 500 to every later read of it."""
    if not isinstance(metadata, dict):
        raise InvalidDocument(f"{where}: {_json_type(metadata)}, not a JSON object", where)
    keys = 0
    stack: list[tuple[Any, str, int]] = [(metadata, where, 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict | list) and depth > limits.max_metadata_depth:
            raise InvalidDocument(f"{path}: nested deeper than {limits.max_metadata_depth} levels", path)
        if isinstance(node, dict):
            keys += len(node)
            if keys > limits.max_metadata_keys:
                raise InvalidDocument(f"{where}: more than {limits.max_metadata_keys} keys in all", where)
            for key in node:
                if problem := metadata_key_problem(key) or _not_utf8(key):
                    raise InvalidDocument(f"{path}: {problem}", path)
            stack.extend((child, f"{path}.{key}", depth + 1) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, f"{path}.{i}", depth + 1) for i, child in enumerate(node))
        elif problem := _scalar_problem(node):
            raise InvalidDocument(f"{path}: {problem}", path)
    size = len(json.dumps(metadata, ensure_ascii=False).encode())
    if size > limits.max_metadata_bytes:
        raise InvalidDocument(
            f"{where}: {size} bytes as JSON, over the limit of {limits.max_metadata_bytes}", where
        )


def _scalar_problem(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if INT64[0] <= value <= INT64[1] else f"{value} is outside 64-bit integers"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, str):
        return _not_utf8(value) or date_problem(value)
    return f"a {type(value).__name__}, not a JSON value"


def _not_utf8(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x})"
    return None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _control_character(text: str) -> str | None:
    found = CONTROL.search(text)
    return None if found is None else f"U+{ord(found.group()):04X}"


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
