"""A restore's import: the archive's ``store.sqlite`` is read, never adopted.

Its rows are written into a store this service creates (``DocumentStore``, as for a new collection), each
document checked as an upsert checks one (``ImportRules``), and everything derived is rebuilt from what was
imported: FTS5 and the filter side table as the rows are written, FAISS from the imported vectors
(``rebuild_vectors``; a replica's own base has its FAISS lists renumbered and checked against them instead),
BM25 and the filter columns when the version opens. So nothing of the archive's
schema (a CHECK constraint, an index, a trigger, a column's declared type) and none of its bookkeeping
(row ids, changelog, state) reaches the restored version: each row is imported whole, or the restore is
refused naming it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from index.archive.checks import BadArchive
from index.records import Document, DocumentLimits, InvalidDocument, check_metadata, id_problem, text_problem
from index.storage.factories import check_search_params
from index.storage.layout import STORE
from index.storage.store import DocumentStore
from index.storage.vectors import (
    VectorIndex,
    build_vectors,
    check_codes,
    check_training,
    read_index_file,
    read_training,
    renumber_lists,
)

log = logging.getLogger(__name__)
SPOT_CHECKS = 1024  # chunks of an adopted FAISS index re-encoded and compared (``rebuild_vectors``)
PAGE = 2000  # rows read, checked and committed at a time: memory is bounded by a page, not the archive
MAX_CHUNK_INDEX = 1 << 31
VectorCheck = Callable[[np.ndarray, Callable[[int], str]], np.ndarray]


@dataclass(frozen=True)
class ImportRules:
    """What an upsert into the target collection checks, applied to every imported row."""

    limits: DocumentLimits = field(default_factory=DocumentLimits)
    text_required: bool = (
        True  # a model's collection embeds text; one of the caller's own vectors may have none
    )
    # A collection of the caller's own vectors checks (and, for cosine, normalises) each vector as its upserts
    # do (``OwnVectors.checked``); a model's vectors are checked finite, of the collection's dimension.
    vectors: VectorCheck | None = None


@dataclass(frozen=True)
class Renumbered:
    """The archive's chunk ids in the order they were imported, and the id each was given."""

    old: np.ndarray
    new: np.ndarray


def import_store(
    source: Path, store: DocumentStore, dimension: int, sequence: int, rules: ImportRules
) -> Renumbered:
    """The documents and chunks of the SQLite file ``source`` into ``store`` (new and empty), then its
    changelog continued after ``sequence``; ``BadArchive`` names the first row that is not fit. Returns how
    the chunks were renumbered (a shipped FAISS index is renumbered the same way: ``rebuild_vectors``)."""
    if not 1 <= dimension <= 1 << 16:
        raise BadArchive(f"the snapshot's dimension {dimension} is out of range")
    try:  # our own extracted copy, which nothing changes: immutable, so SQLite writes nothing beside it
        archive = sqlite3.connect(f"file:{source}?mode=ro&immutable=1", uri=True)
        archive.execute("PRAGMA trusted_schema = OFF")  # no function its schema names may have side effects
    except sqlite3.Error as exc:
        raise BadArchive(f"{STORE} does not open as SQLite: {exc}") from exc
    try:
        with store.unjournaled():
            with store.bulk_load():
                rids = _import_documents(archive, store, rules)
            renumbered = _import_chunks(archive, store, rids, dimension, rules)
            with store.transaction() as conn:
                store.continue_changelog(conn, sequence)
    finally:
        archive.close()
    return renumbered


def rebuild_vectors(
    store: DocumentStore,
    dimension: int,
    sidecar: dict[str, Any],
    shipped: Path | None = None,
    renumbered: Renumbered | None = None,
) -> VectorIndex:
    """FAISS from the imported vectors, of the factory and search parameters the archive's sidecar names
    (checked: ``checks.check_sidecar``); exact search when too few vectors remain to train that factory.
    ``shipped``: the archive's own FAISS file (a replica's base). Its lists are adopted, renumbered as the
    import renumbered the chunks, when they hold every imported chunk once and nothing else and a sample of
    ``SPOT_CHECKS`` chunks sits where and as its stored vector encodes (``_adopted``); otherwise its training
    is reused when it is that factory's and the imported vectors added; otherwise (logged) trained again."""
    if shipped is not None and renumbered is not None and not sidecar.get("tombstones"):
        if adopted := _adopted(shipped, store, dimension, sidecar, renumbered):
            return adopted
    trained = _shipped_training(shipped, sidecar["factory"], dimension) if shipped else None
    try:
        vectors = build_vectors(store, dimension, sidecar["factory"], trained)
    except ValueError:  # e.g. fewer vectors than an IVF factory's lists, as ``OpenVersion.rebuild_vectors``
        return build_vectors(store, dimension, None)
    vectors.params = vectors.params | check_search_params(sidecar.get("params"))
    return vectors


def _adopted(
    path: Path, store: DocumentStore, dimension: int, sidecar: dict[str, Any], renumbered: Renumbered
) -> VectorIndex | None:
    """The shipped index with its lists renumbered, when it passes ``rebuild_vectors``'s checks; None
    (logged) when it does not, or when its factory needs no training (nothing to save: it is added)."""
    empty = VectorIndex.create(sidecar["factory"], dimension)
    if not empty.needs_training or not len(renumbered.new):
        return None
    rng = np.random.default_rng()
    sample = np.sort(rng.choice(renumbered.new, min(SPOT_CHECKS, len(renumbered.new)), replace=False))
    try:
        index = read_index_file(path)
        check_training(index, empty.index)
        where = renumber_lists(index, renumbered.old, renumbered.new, sample)
        check_codes(index, where, sample, store.vectors_of(sample, dimension))
    except ValueError as exc:
        log.warning(
            "the base's FAISS lists are not adopted (%s): its vectors are added again", str(exc)[:200]
        )
        return None
    return VectorIndex(index, empty.factory, empty.params)


def _shipped_training(path: Path, factory: str, dimension: int) -> Any:
    """The shipped index when ``factory`` trains and its training can be reused (``read_training``); None
    otherwise (logged when it could not be): FAISS is then trained on the imported vectors, as for any
    archive. A factory without training never has the file read."""
    empty = VectorIndex.create(factory, dimension)
    if not empty.needs_training:
        return None
    try:
        return read_training(path, empty.index)
    except ValueError as exc:
        log.warning("the base's FAISS training is not reused (%s): training again", str(exc)[:200])
        return None


def _rows(archive: sqlite3.Connection, sql: str) -> Iterator[list[Any]]:
    """``sql``'s rows a page at a time, any failure to read them the archive's (a missing table or column,
    text that is not UTF-8, a damaged page). One scan, no ORDER BY: nothing leans on the archive's indexes."""
    try:
        cursor = archive.execute(sql)
        while rows := cursor.fetchmany(PAGE):
            yield rows
    except sqlite3.Error as exc:
        raise BadArchive(f"{STORE} cannot be read: {exc}") from exc


def _import_documents(archive: sqlite3.Connection, store: DocumentStore, rules: ImportRules) -> np.ndarray:
    """Every document, stored as an upsert stores one (its FTS5 row and filter values with it), a page at a
    time; returns the archive's rid of each, in the order written."""
    old_rids = array("q")
    for rows in _rows(archive, "SELECT rid, id, text, metadata FROM documents"):
        documents = []
        for rid, doc_id, text, metadata in rows:
            documents.append(_document(doc_id, text, metadata, rules))
            if type(rid) is not int:
                raise BadArchive(f"{STORE}: document {doc_id[:80]!r} has the row id {str(rid)[:40]!r}")
            old_rids.append(rid)
        try:
            with store.transaction() as conn:
                store.add_documents(conn, documents)
        except sqlite3.IntegrityError as exc:  # our store's UNIQUE id: the archive repeats one
            raise BadArchive(f"{STORE}: a document id appears more than once") from exc
    rids = np.frombuffer(old_rids, np.int64) if old_rids else np.zeros(0, np.int64)
    if len(np.unique(rids)) != len(rids):
        raise BadArchive(f"{STORE}: two documents have the same row id")
    return rids


def _document(doc_id: Any, text: Any, metadata: Any, rules: ImportRules) -> Document:
    where = f"{STORE}: document {str(doc_id)[:80]!r}"
    if not isinstance(metadata, str):
        raise BadArchive(f"{where}: its metadata is {type(metadata).__name__}, not JSON text")
    try:
        parsed = json.loads(metadata, parse_constant=_not_json)
    except RecursionError as exc:
        raise BadArchive(f"{where}: its metadata is nested too deeply to read") from exc
    except ValueError as exc:
        raise BadArchive(f"{where}: its metadata is not JSON: {str(exc)[:100]}") from exc
    try:
        return checked_document(doc_id, text, parsed, rules)
    except InvalidDocument as exc:
        raise BadArchive(f"{STORE}: {exc}") from exc


def checked_document(doc_id: Any, text: Any, metadata: Any, rules: ImportRules) -> Document:
    """The document an upsert would store, or ``InvalidDocument`` naming it and why not (a restore's rows and
    a replica's tail segments come through here: neither is trusted more than a request)."""
    if not isinstance(doc_id, str) or id_problem(doc_id):
        raise InvalidDocument(f"a document id {str(doc_id)[:80]!r} is not one an upsert accepts", "id")
    where = f"document {doc_id[:80]!r}"
    if not isinstance(text, str):
        raise InvalidDocument(f"{where}: its text is {type(text).__name__}, not text", "text")
    if problem := text_problem(text, rules.limits, rules.text_required):
        raise InvalidDocument(f"{where}: text: {problem}", "text")
    check_metadata(metadata, f"{where}: metadata", rules.limits)
    return Document(doc_id, text, metadata)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _import_chunks(
    archive: sqlite3.Connection,
    store: DocumentStore,
    old_rids: np.ndarray,
    dimension: int,
    rules: ImportRules,
) -> Renumbered:
    """Every chunk under its document's new rid, with its vector checked as an upsert checks one."""
    order = np.argsort(old_rids, kind="stable")
    known = old_rids[order]
    # Documents were written in order into an empty table, so the k-th written has the k-th smallest rid.
    written = store.query("SELECT rid FROM documents ORDER BY rid")
    new_rids = np.fromiter((row[0] for row in written), np.int64, count=len(old_rids))
    old_ids = array("q")
    for rows in _rows(archive, "SELECT doc_rid, chunk_index, text, vector, id FROM chunks"):
        for doc_rid, chunk_index, text, vector, chunk_id in rows:
            _check_chunk(doc_rid, chunk_index, text, vector, dimension, rules)
            if type(chunk_id) is not int:
                raise BadArchive(f"{STORE}: a chunk has the id {str(chunk_id)[:40]!r}")
            old_ids.append(chunk_id)
        wanted = np.array([row[0] for row in rows], np.int64)
        at = np.minimum(np.searchsorted(known, wanted), max(len(known) - 1, 0))
        if not len(known) or not (known[at] == wanted).all():
            orphan = wanted[known[at] != wanted][0] if len(known) else wanted[0]
            raise BadArchive(
                f"{STORE}: a chunk belongs to document row {orphan}, which the archive does not hold"
            )
        _write_chunks(store, rows, new_rids[order[at]], dimension, rules)
    # As for documents: the k-th chunk written has the k-th smallest id.
    new_ids = np.fromiter(
        (row[0] for row in store.query("SELECT id FROM chunks ORDER BY id")), np.int64, count=len(old_ids)
    )
    return Renumbered(np.frombuffer(old_ids, np.int64) if old_ids else np.zeros(0, np.int64), new_ids)


def _write_chunks(
    store: DocumentStore, rows: list[Any], rids: np.ndarray, dimension: int, rules: ImportRules
) -> None:
    """One page of checked chunks, under their documents' new rids, with their vectors checked."""
    matrix = np.frombuffer(b"".join(row[3] for row in rows), np.float32).reshape(len(rows), dimension)
    matrix = _checked_vectors(matrix, rules, lambda i: _chunk_name(store, rids[i], rows[i][1]))
    with store.transaction() as conn:
        chunks = [(int(rid), row[1], row[2]) for rid, row in zip(rids, rows, strict=True)]
        store.add_chunks(conn, chunks, matrix)


def _check_chunk(
    doc_rid: Any, chunk_index: Any, text: Any, vector: Any, dimension: int, rules: ImportRules
) -> None:
    if type(doc_rid) is not int or type(chunk_index) is not int or not 0 <= chunk_index < MAX_CHUNK_INDEX:
        raise BadArchive(
            f"{STORE}: a chunk has the document row {str(doc_rid)[:40]!r} and position {str(chunk_index)[:40]!r}"
        )
    if not isinstance(text, str) or len(text) > rules.limits.max_document_chars:
        raise BadArchive(f"{STORE}: a chunk's text is not text within the document limit")
    if not isinstance(vector, bytes) or len(vector) != 4 * dimension:
        got = f"{len(vector)} bytes" if isinstance(vector, bytes) else type(vector).__name__
        raise BadArchive(f"{STORE}: a chunk's vector is {got}, not {dimension} float32 numbers")


def _checked_vectors(matrix: np.ndarray, rules: ImportRules, name: Callable[[int], str]) -> np.ndarray:
    try:
        return checked_vectors(matrix, rules, name)
    except ValueError as exc:
        raise BadArchive(f"{STORE}: {exc}") from exc


def checked_vectors(matrix: np.ndarray, rules: ImportRules, name: Callable[[int], str]) -> np.ndarray:
    """``matrix`` as an upsert into the collection would store it, or ``ValueError`` naming the first unfit
    row (``name(row)``): the caller's own vectors by their collection's rules, a model's checked finite."""
    if rules.vectors is not None:
        return rules.vectors(matrix, name)
    unfit = ~np.isfinite(matrix).all(axis=1)
    if unfit.any():
        raise ValueError(f"{name(int(unfit.argmax()))} holds NaN or an infinity")
    return matrix


def _chunk_name(store: DocumentStore, rid: int, chunk_index: int) -> str:
    """How a refusal names a chunk: by its document's id (only looked up when one is refused)."""
    row = store.query("SELECT id FROM documents WHERE rid = ?", (int(rid),)).fetchone()
    return f"document {str(row[0] if row else rid)[:80]!r}: chunk {chunk_index}: vector"
