"""The document store: SQLite in WAL mode, the source of truth of an index version.

It holds documents, their chunks, metadata (JSON), an FTS5 table for BM25, and every chunk's vector as
a float32 blob. FAISS is derived from it: it can be rebuilt, caught up or re-scored without running the
encoder again. ``synchronous=FULL`` makes a commit durable when it returns (the contract of
``SearchIndex.upsert``). Chunk ids are ``AUTOINCREMENT`` so an id is never reused: they double as FAISS
ids, and a changed document gets new ids instead of silently re-pointing old vectors.

The ``changelog`` records every chunk added or removed after the bulk build, so a FAISS snapshot written
at sequence ``s`` is brought up to date by replaying ``seq > s`` (on open, in another replica, or onto a
version being rebuilt).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from index.records import Document, DocumentStoreError, StorageError
from index.storage.filters import (
    DATE_SHAPE,
    EVERYTHING,
    Filter,
    check_known_fields,
    predicates,
    to_sql,
)
from index.text.analysis import fts_query
from index.text.chunking import Chunk

log = logging.getLogger(__name__)
SCHEMA = """
CREATE TABLE IF NOT EXISTS documents(
    rid INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_rid INTEGER NOT NULL,
    chunk_index INTEGER NOT NULL,
    text TEXT NOT NULL,
    vector BLOB
);
CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_rid);
CREATE INDEX IF NOT EXISTS chunks_pending ON chunks(id) WHERE vector IS NULL;
CREATE VIRTUAL TABLE IF NOT EXISTS documents_fts USING fts5(
    text, content='documents', content_rowid='rid', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS documents_ai AFTER INSERT ON documents BEGIN
    INSERT INTO documents_fts(rowid, text) VALUES (new.rid, new.text);
END;
CREATE TRIGGER IF NOT EXISTS documents_ad AFTER DELETE ON documents BEGIN
    INSERT INTO documents_fts(documents_fts, rowid, text) VALUES ('delete', old.rid, old.text);
END;
CREATE TRIGGER IF NOT EXISTS documents_au AFTER UPDATE OF text ON documents BEGIN
    INSERT INTO documents_fts(documents_fts, rowid, text) VALUES ('delete', old.rid, old.text);
    INSERT INTO documents_fts(rowid, text) VALUES (new.rid, new.text);
END;
CREATE TABLE IF NOT EXISTS fields(name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS changelog(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, doc_id TEXT NOT NULL, chunk_id INTEGER NOT NULL, op TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS doc_values(
    doc_rid INTEGER NOT NULL, field TEXT NOT NULL, type TEXT NOT NULL, value, num REAL
);
CREATE INDEX IF NOT EXISTS doc_values_value ON doc_values(field, value, type, doc_rid);
CREATE INDEX IF NOT EXISTS doc_values_num ON doc_values(field, num, type, doc_rid);
CREATE INDEX IF NOT EXISTS doc_values_doc ON doc_values(doc_rid);
"""
# ``doc_values``: one row per metadata element a filter can test (a field's scalar value, or each element of
# its list: exactly the rows ``json_each`` yields with a non-text key), with ``num`` the julianday() of a
# date-shaped string. Filters read it by index (``to_sql(values_table=True)``) instead of parsing
# every document's JSON: a filter over 100k documents cost 80-250 ms a query without it. The indexes cover
# what a predicate reads (type, doc_rid): without that each matching row cost a table lookup as well.
FILL_VALUES = f"""
INSERT INTO doc_values(doc_rid, field, type, value, num)
SELECT d.rid, f.key, e.type, e.value, CASE
    WHEN e.type IN ('integer', 'real') THEN e.value
    WHEN e.type = 'text' AND e.value GLOB '{DATE_SHAPE}' THEN julianday(e.value) END
FROM documents d, json_each(d.metadata) f, json_each(d.metadata, '$."' || f.key || '"') e
WHERE typeof(e.key) <> 'text' AND """


@dataclass(frozen=True)
class ChunkRow:
    chunk_id: int
    doc_id: str
    chunk_text: str
    chunk_index: int


class DocumentStore:
    """Thread-safe access: one connection per thread for reads (WAL readers never block), one writer lock."""

    def __init__(self, path: Path, create: bool = True, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        # How a read-only store is read. ``immutable=1`` tells SQLite the file never changes (no locks, no
        # -wal or -shm written: fits a read-only mount), which is false beside a live writer: a replica
        # read pages the writer was checkpointing ("database disk image is malformed") and never
        # saw its WAL. So immutable only while no WAL exists (no writer has the store open); with one, an
        # ordinary WAL reader (``mode=ro``) that sees each commit; ``writer_appeared`` tells the follower
        # to reopen when a writer starts later. A read-only mount holding a -wal needs its -shm as well.
        self.immutable = read_only and not wal_file(self.path).exists()
        if not create and not self.path.is_file():
            raise DocumentStoreError(f"document store not found: {self.path}")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self.write_lock = threading.RLock()
        try:
            if not read_only:
                self._conn().executescript(SCHEMA)
                if self.get_state("doc_values") != "1":  # a store written before the side table: fill it once
                    with self.transaction() as conn:
                        conn.execute("DELETE FROM doc_values")
                        conn.execute(FILL_VALUES + "1")
                        self.set_state(conn, "doc_values", "1")
        except sqlite3.DatabaseError as exc:
            raise DocumentStoreError(f"cannot open document store {self.path}: {exc}") from exc
        self._fields = {row[0] for row in self._conn().execute("SELECT name FROM fields")}
        self.values_table = self.get_state("doc_values") == "1"  # else (an old store, read-only): json_each

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.read_only:
                uri = f"file:{self.path}?mode=ro{'&immutable=1' if self.immutable else ''}"
                conn = sqlite3.connect(
                    uri, uri=True, timeout=10, isolation_level=None, check_same_thread=False
                )
            else:
                conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA foreign_keys=OFF")
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    @property
    def writer_appeared(self) -> bool:
        """Read as immutable, but a writer has opened the store since: reopen it as a WAL reader."""
        return self.immutable and wal_file(self.path).exists()

    def close(self) -> None:
        with self._connections_lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One durable write transaction (BEGIN IMMEDIATE: writers queue here, readers carry on).

        All or nothing, including a failed ``COMMIT`` (a full disk fails there, when the WAL grows): it is
        rolled back, so the connection is clean for the next write once space returns. A disk error comes
        out as ``StorageError`` (``full`` set for ENOSPC)."""
        with self.write_lock:
            conn = self._conn()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    self._rollback(conn)
                    raise
            except sqlite3.Error as exc:
                error = storage_error(exc, self.path)
                if error is exc:
                    raise
                raise error from exc

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction on this thread's connection: every read inside sees the store as of one commit
        (a search's rows, a listing's page and its total), whatever another process commits meanwhile."""
        conn = self._conn()
        if conn.in_transaction:  # already inside one (nested reads): it holds the snapshot
            yield
            return
        conn.execute("BEGIN")
        try:
            yield
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")

    def _rollback(self, conn: sqlite3.Connection) -> None:
        """SQLite rolls a transaction back itself on SQLITE_FULL; other failures (a busy or failed COMMIT,
        an error in the caller) leave it open, and a connection left inside it would refuse every later
        ``BEGIN``. Rolling back only when one is open also keeps the original error the one raised."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:  # the connection is unusable: drop it, the next write opens a fresh one
            self._discard(conn)

    def _discard(self, conn: sqlite3.Connection) -> None:
        with self._connections_lock:
            if conn in self._connections:
                self._connections.remove(conn)
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        try:
            conn.close()
        except sqlite3.Error:
            pass

    # ---- writes -------------------------------------------------------------------------------------

    def write_documents(
        self,
        conn: sqlite3.Connection,
        items: Sequence[tuple[Document, list[Chunk], np.ndarray | None]],
        log: bool,
    ) -> tuple[list[int], list[int]]:
        """Insert or replace documents with their chunks (and vectors, when given). Returns (removed, added) ids."""
        removed: list[int] = []
        added: list[int] = []
        new_fields: set[str] = set()
        for document, chunks, vectors in items:
            meta = metadata_json(document)
            row = conn.execute("SELECT rid FROM documents WHERE id = ?", (document.id,)).fetchone()
            if row is None:
                rid = conn.execute(
                    "INSERT INTO documents(id, text, metadata) VALUES (?, ?, ?)",
                    (document.id, document.text, meta),
                ).lastrowid
            else:
                rid = row[0]
                removed += self._drop_chunks(conn, rid, document.id, log)
                conn.execute(
                    "UPDATE documents SET text = ?, metadata = ? WHERE rid = ?", (document.text, meta, rid)
                )
                conn.execute("DELETE FROM doc_values WHERE doc_rid = ?", (rid,))
            if document.metadata:
                conn.execute(FILL_VALUES + "d.rid = ?", (rid,))
            for position, chunk in enumerate(chunks):
                blob = None if vectors is None else np.asarray(vectors[position], np.float32).tobytes()
                chunk_id = conn.execute(
                    "INSERT INTO chunks(doc_rid, chunk_index, text, vector) VALUES (?, ?, ?, ?)",
                    (rid, chunk.index, chunk.text, blob),
                ).lastrowid
                added.append(int(chunk_id or 0))
                if log:
                    conn.execute(
                        "INSERT INTO changelog(doc_id, chunk_id, op) VALUES (?, ?, '+')",
                        (document.id, chunk_id),
                    )
            new_fields.update(k for k in document.metadata if k not in self._fields)
        self._note_fields(conn, new_fields)
        return removed, added

    @contextmanager
    def unjournaled(self) -> Iterator[None]:
        """Filling a store no reader sees yet (a restore's unpublished draft, discarded whole if anything fails):
        no journal and no fsync per commit (each row written once, not to the WAL and again at its checkpoint:
        a quarter of the import measured at 100,000 chunks), then back to the WAL and the file fsync'd
        once, durable before anything publishes it. The calling thread's connection must be the only one."""
        conn = self._conn()
        conn.execute("PRAGMA journal_mode=OFF")  # refused (WAL kept) while another connection is open
        conn.execute("PRAGMA synchronous=OFF")
        yield  # a body that raises leaves the store as it is: its caller discards it
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # had WAL been kept: its pages into the file
        fsync_file(self.path)

    @contextmanager
    def bulk_load(self) -> Iterator[None]:
        """Filling an empty store (a restore's import): FTS5 is filled once when the body returns, from the
        documents table (its ``rebuild``), not by the insert trigger once per document (7x faster measured
        at 20,000 documents); the trigger is back, exactly as it was, in the same transaction. A body
        that raises leaves the store without FTS5 rows or trigger: its caller discards such a store."""
        with self.transaction() as conn:
            (trigger,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'documents_ai'").fetchone()
            conn.execute("DROP TRIGGER documents_ai")
        yield
        with self.transaction() as conn:
            conn.execute("INSERT INTO documents_fts(documents_fts) VALUES ('rebuild')")
            conn.execute(trigger)

    def add_documents(self, conn: sqlite3.Connection, documents: Sequence[Document]) -> None:
        """Documents new to the store, without chunks, stored as ``write_documents`` stores them but a page
        at a time (a restore's import into an empty store: one statement per page, not three per document).
        A repeated id raises ``sqlite3.IntegrityError``."""
        if not documents:
            return
        first = conn.execute("SELECT COALESCE(MAX(rid), 0) FROM documents").fetchone()[0]
        conn.executemany(
            "INSERT INTO documents(id, text, metadata) VALUES (?, ?, ?)",
            [(d.id, d.text, metadata_json(d)) for d in documents],
        )
        conn.execute(FILL_VALUES + "d.rid > ?", (first,))
        self._note_fields(conn, {k for d in documents for k in d.metadata if k not in self._fields})

    def _note_fields(self, conn: sqlite3.Connection, new_fields: set[str]) -> None:
        if new_fields:
            conn.executemany("INSERT OR IGNORE INTO fields(name) VALUES (?)", [(f,) for f in new_fields])
            self._fields |= new_fields

    def _drop_chunks(self, conn: sqlite3.Connection, rid: int, doc_id: str, log: bool) -> list[int]:
        ids = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE doc_rid = ?", (rid,))]
        conn.execute("DELETE FROM chunks WHERE doc_rid = ?", (rid,))
        if log:
            conn.executemany(
                "INSERT INTO changelog(doc_id, chunk_id, op) VALUES (?, ?, '-')", [(doc_id, i) for i in ids]
            )
        return ids

    def delete_document(self, conn: sqlite3.Connection, doc_id: str, log: bool) -> list[int] | None:
        row = conn.execute("SELECT rid FROM documents WHERE id = ?", (doc_id,)).fetchone()
        if row is None:
            return None
        removed = self._drop_chunks(conn, row[0], doc_id, log)
        conn.execute("DELETE FROM documents WHERE rid = ?", (row[0],))
        conn.execute("DELETE FROM doc_values WHERE doc_rid = ?", (row[0],))
        return removed

    def add_chunks(
        self, conn: sqlite3.Connection, rows: Sequence[tuple[int, int, str]], vectors: np.ndarray
    ) -> None:
        """Chunks ``(doc_rid, chunk_index, text)`` with their vectors for documents already written, unlogged
        (a restore's import: its documents are written first, then the archive's chunks page by page)."""
        conn.executemany(
            "INSERT INTO chunks(doc_rid, chunk_index, text, vector) VALUES (?, ?, ?, ?)",
            [(*row, vector.tobytes()) for row, vector in zip(rows, vectors.astype(np.float32), strict=True)],
        )

    def continue_changelog(self, conn: sqlite3.Connection, seq: int) -> None:
        """Start an empty version's changelog after ``seq`` (a restored version continues its archive's
        sequence), every entry up to it counted as pruned: no copy of the index can replay them from here."""
        conn.execute("DELETE FROM sqlite_sequence WHERE name = 'changelog'")
        conn.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('changelog', ?)", (seq,))
        self.set_state(conn, "changelog_pruned_through", str(seq))

    def set_vectors(self, conn: sqlite3.Connection, ids: Sequence[int], vectors: np.ndarray) -> None:
        conn.executemany(
            "UPDATE chunks SET vector = ? WHERE id = ?",
            [(np.asarray(v, np.float32).tobytes(), int(i)) for i, v in zip(ids, vectors, strict=True)],
        )

    # ---- state --------------------------------------------------------------------------------------

    def get_state(self, key: str, default: str | None = None) -> str | None:
        row = self._conn().execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    @staticmethod
    def set_state(conn: sqlite3.Connection, key: str, value: str) -> None:
        conn.execute("INSERT OR REPLACE INTO state(key, value) VALUES (?, ?)", (key, value))

    # ---- reads --------------------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """A read on this thread's connection (the in-memory columns load and follow the store through it)."""
        return self._conn().execute(sql, params)

    def counts(self) -> dict[str, int]:
        conn = self._conn()
        documents = conn.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
        chunks = conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        return {"documents": int(documents), "chunks": int(chunks)}

    def fields(self) -> set[str]:
        return set(self._fields)

    def refresh_fields(self) -> None:
        self._fields = {row[0] for row in self._conn().execute("SELECT name FROM fields")}

    def get(self, doc_id: str) -> Document | None:
        row = (
            self._conn()
            .execute("SELECT id, text, metadata FROM documents WHERE id = ?", (doc_id,))
            .fetchone()
        )
        return None if row is None else Document(row[0], row[1], json.loads(row[2]))

    def iter_documents(self, batch: int = 1000) -> Iterator[Document]:
        """All documents in insertion order, read in pages so memory stays bounded."""
        for _, document in self.iter_rows(batch):
            yield document

    def iter_rows(self, batch: int = 1000) -> Iterator[tuple[int, Document]]:
        """(rid, document) for every document, as ``iter_documents``."""
        last = 0
        while True:
            rows = (
                self._conn()
                .execute(
                    "SELECT rid, id, text, metadata FROM documents WHERE rid > ? ORDER BY rid LIMIT ?",
                    (last, batch),
                )
                .fetchall()
            )
            if not rows:
                return
            for rid, doc_id, text, meta in rows:
                last = rid
                yield rid, Document(doc_id, text, json.loads(meta))

    def pending_chunks(self, limit: int, after: int = 0) -> tuple[list[int], list[str]]:
        rows = (
            self._conn()
            .execute(
                "SELECT id, text FROM chunks WHERE vector IS NULL AND id > ? ORDER BY id LIMIT ?",
                (after, limit),
            )
            .fetchall()
        )
        return [r[0] for r in rows], [r[1] for r in rows]

    def count_pending(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM chunks WHERE vector IS NULL").fetchone()[0])

    def iter_vectors(
        self, batch: int = 20000, dimension: int | None = None
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids int64, vectors float32) pages in id order: how FAISS is filled without holding the corpus."""
        last = 0
        while True:
            rows = (
                self._conn()
                .execute(
                    "SELECT id, vector FROM chunks WHERE id > ? AND vector IS NOT NULL ORDER BY id LIMIT ?",
                    (last, batch),
                )
                .fetchall()
            )
            if not rows:
                return
            last = rows[-1][0]
            yield _unpack(rows, dimension)

    def vectors_of(self, ids: np.ndarray, dimension: int) -> np.ndarray:
        """The stored vectors of chunks ``ids`` (each holding one), in that order."""
        found: dict[int, bytes] = {}
        for page in range(0, len(ids), 500):  # within SQLite's bound on a statement's parameters
            chunk = [int(i) for i in ids[page : page + 500]]
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT id, vector FROM chunks WHERE id IN ({marks}) AND vector IS NOT NULL"
            found.update(self._conn().execute(sql, chunk).fetchall())
        return _unpack([(int(i), found[int(i)]) for i in ids], dimension)[1]

    def sample_vectors(self, count: int, dimension: int) -> np.ndarray:
        """A uniform sample of stored vectors (IVF / PQ training needs a sample, not the corpus)."""
        total = self.counts()["chunks"]
        if total <= count:
            return np.concatenate(
                [v for _, v in self.iter_vectors(dimension=dimension)]
                or [np.zeros((0, dimension), np.float32)]
            )
        rows = (
            self._conn()
            .execute(
                "SELECT id, vector FROM chunks WHERE vector IS NOT NULL AND abs(random()) % ? < ? ",
                (total, count),
            )
            .fetchall()
        )
        return _unpack(rows, dimension)[1]

    def vectors(self, ids: Iterable[int], dimension: int) -> tuple[np.ndarray, np.ndarray]:
        rows = (
            self._conn()
            .execute(
                "SELECT id, vector FROM chunks WHERE id IN (SELECT value FROM json_each(?)) AND vector IS NOT NULL",
                (json.dumps([int(i) for i in ids]),),
            )
            .fetchall()
        )
        return _unpack(rows, dimension)

    def chunk_documents(self, ids: Iterable[int]) -> dict[int, str]:
        """chunk id -> document id: all that ranking needs (texts and metadata are read for the final top-k only)."""
        rows = self._conn().execute(
            "SELECT c.id, d.id FROM chunks c JOIN documents d ON d.rid = c.doc_rid "
            "WHERE c.id IN (SELECT value FROM json_each(?))",
            (json.dumps([int(i) for i in ids]),),
        )
        return dict(rows.fetchall())

    def chunks_of(self, doc_ids: Iterable[str]) -> dict[str, list[ChunkRow]]:
        """The chunks of each document, without the document's own text (``documents_of`` reads that once:
        joined per chunk, a 500 KB document was read once per chunk and one search peaked at 2.3 GB)."""
        rows = self._conn().execute(
            "SELECT c.id, d.id, c.text, c.chunk_index FROM chunks c JOIN documents d ON d.rid = c.doc_rid "
            "WHERE d.id IN (SELECT value FROM json_each(?)) ORDER BY c.chunk_index",
            (json.dumps(list(doc_ids)),),
        )
        out: dict[str, list[ChunkRow]] = {}
        for r in rows:
            out.setdefault(r[1], []).append(ChunkRow(r[0], r[1], r[2], r[3]))
        return out

    def documents_of(self, doc_ids: Iterable[str], text_chars: int | None = None) -> dict[str, Document]:
        """Each document once: id -> ``Document`` (missing ids are left out), its text cut at ``text_chars``
        characters by SQLite (so a caller that needs none or a prefix never reads a long text whole)."""
        text = "text" if text_chars is None else f"substr(text, 1, {int(text_chars)})"
        rows = self._conn().execute(
            f"SELECT id, {text}, metadata FROM documents WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(doc_ids)),),
        )
        return {r[0]: Document(r[0], r[1], json.loads(r[2])) for r in rows}

    def matching_documents(self, doc_ids: Iterable[str], tree: Filter) -> set[str]:
        """Which of ``doc_ids`` (a few hundred candidates) match ``tree``: each row's JSON is tested, never the
        side table's whole match set (that is what a broad filter costs)."""
        where, params = self.filter_sql(tree, values_table=False)
        rows = self._conn().execute(
            f"SELECT d.id FROM documents d WHERE d.id IN (SELECT value FROM json_each(?)) AND {where}",
            [json.dumps(list(doc_ids)), *params],
        )
        return {r[0] for r in rows}

    def filter_sql(self, tree: Filter | None, values_table: bool = True) -> tuple[str, list[Any]]:
        """The WHERE clause of a parsed filter (``index.storage.filters.to_sql``; every document for None)."""
        return to_sql(tree or EVERYTHING, values_table=values_table and self.values_table)

    def check_fields(self, tree: Filter) -> None:
        """``UnknownFilterField`` for a field no document ever had, looked up again first since another process
        may have added it."""
        if any(predicate.field not in self._fields for predicate in predicates(tree)):
            self.refresh_fields()
        check_known_fields(tree, self._fields)

    def list_documents(
        self, limit: int, after: str | None, tree: Filter | None, max_bytes: int | None = None
    ) -> list[Document]:
        """Up to ``limit`` documents whose id sorts after ``after``, in id order (binary collation).

        Ordered by id, not rid: an id never changes while its document exists, and a rebuild renumbers rids,
        so keyset paging over ids neither repeats nor skips a document that exists the whole time, whatever
        is upserted, deleted or rebuilt between pages (the UNIQUE index on id serves the order). Reading stops
        after the document that takes the texts and metadata past ``max_bytes``."""
        where, params = self.filter_sql(tree)
        rows = self._conn().execute(
            f"SELECT d.id, d.text, d.metadata FROM documents d WHERE d.id > ? AND {where} ORDER BY d.id LIMIT ?",
            [after if after is not None else "", *params, limit],
        )
        found, size = [], 0
        for row in rows:
            found.append(Document(row[0], row[1], json.loads(row[2])))
            size += len(row[1]) + len(row[2])
            if max_bytes is not None and size > max_bytes:
                break
        return found

    def count_documents(self, tree: Filter | None) -> int:
        where, params = self.filter_sql(tree)
        return int(
            self._conn().execute(f"SELECT COUNT(*) FROM documents d WHERE {where}", params).fetchone()[0]
        )

    def bm25(self, text: str, limit: int, tree: Filter | None = None) -> list[tuple[str, float]]:
        expression = fts_query(text)
        if not expression:
            return []
        where, params = self.filter_sql(tree)
        rows = self._conn().execute(
            "SELECT d.id, -documents_fts.rank FROM documents_fts JOIN documents d ON d.rid = documents_fts.rowid "
            f"WHERE documents_fts MATCH ? AND {where} ORDER BY documents_fts.rank, d.id LIMIT ?",
            [expression, *params, limit],
        )
        return [(r[0], float(r[1])) for r in rows]

    def max_seq(self) -> int:
        """The last changelog sequence ever issued (AUTOINCREMENT's counter: pruning doesn't lower it)."""
        row = self._conn().execute("SELECT seq FROM sqlite_sequence WHERE name = 'changelog'").fetchone()
        return int(row[0]) if row else 0

    def pruned_through(self) -> int:
        """Changelog entries up to here are gone: a copy of the index behind this point must reload."""
        return int(self.get_state("changelog_pruned_through", "0") or 0)

    def prune_changelog(self, through: int) -> int:
        """Drop entries up to ``through`` (already in a saved FAISS snapshot); returns how many went."""
        with self.transaction() as conn:
            deleted = conn.execute("DELETE FROM changelog WHERE seq <= ?", (through,)).rowcount
            if through > self.pruned_through():
                self.set_state(conn, "changelog_pruned_through", str(through))
        return deleted

    def changes_since(self, seq: int) -> list[tuple[int, str, int, str]]:
        return (
            self._conn()
            .execute("SELECT seq, doc_id, chunk_id, op FROM changelog WHERE seq > ? ORDER BY seq", (seq,))
            .fetchall()
        )

    def chunk_exists(self, ids: Iterable[int]) -> set[int]:
        rows = self._conn().execute(
            "SELECT id FROM chunks WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps([int(i) for i in ids]),),
        )
        return {r[0] for r in rows}


def metadata_json(document: Document) -> str:
    """How a document's metadata is stored."""
    return json.dumps(document.metadata, ensure_ascii=False, default=str)


def wal_file(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


DISK_ERRORS = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN}


def storage_error(exc: sqlite3.Error, path: Path) -> Exception:
    """A disk failure as ``StorageError`` (with the reason), anything else as it was."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or (code & 0xFF) not in DISK_ERRORS:
        return exc
    full = code & 0xFF == sqlite3.SQLITE_FULL
    reason = "the disk is full" if full else f"the disk refused the write ({exc})"
    log.warning("%s under %s: the write was rolled back", reason, path.parent)
    return StorageError(
        f"{reason}: the write was refused whole (nothing kept); retry when it has room", full=full
    )


def _unpack(rows: list[tuple[int, bytes]], dimension: int | None) -> tuple[np.ndarray, np.ndarray]:
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    if not rows:
        return ids, np.zeros((0, dimension or 0), np.float32)
    matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
    return ids, matrix


def fsync_file(path: Path) -> None:
    """``path``'s written bytes to disk (the store's, FAISS's and a published version's files)."""
    with Path(path).open("rb") as handle:
        os.fsync(handle.fileno())
