"""Filterable metadata in memory, as columns beside the vectors: a filter becomes a mask over documents in a few
vectorised passes, then a bitmap over chunk ids that FAISS (``IDSelectorBitmap``) and BM25 (tantivy) skip by.

SQLite stays the record; the columns follow the store's changelog, as FAISS and BM25 do, and are saved beside FAISS
(``save``: one ``.npy`` file per array in a folder of their own, named by ``columns.json`` with the changelog point
they hold) so a version opens by mapping them (``open``: pages read as filters touch them, copy-on-write) and
replaying the changelog past that point; without the files (a version saved before them, damaged ones) they are
read from the store (``load``). Each field keeps, per
document row (the store's ``rid``), the first element of its value: a kind (number, text, true, false, other), a
number (the value, or a date-shaped text's instant as SQLite's ``julianday()``, so both sides of a date comparison
are computed alike) and a text's dictionary code; further list elements go to an overflow list of (row, element).
The semantics are ``index.storage.filters``' (``to_sql``): ``Columns.mask`` evaluates the same parsed tree, and the
property tests hold the two backends to each other.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from index.records import DamagedFile
from index.storage.filters import DATE_SHAPE, All, Either, Equals, Exists, Filter, Not, Range
from index.storage.store import DocumentStore
from index.storage.vectors import atomic_write, fsync_dir

NONE, NUMBER, TEXT, TRUE, FALSE, OTHER = range(6)
KINDS = {"integer": NUMBER, "real": NUMBER, "text": TEXT, "true": TRUE, "false": FALSE}
EXACT_INTEGER = 2**53  # past this a float64 column cannot hold an integer exactly: such filters stay in SQL
FEW_VALUES = 8  # an equality's values compared one pass each (``_one_of``); more through a table or np.isin
TABLE_SPAN = 1 << 20  # whole numbers at most this far apart are looked up in a table of their span (1 MB)
PAGE = 50_000  # document rows read from the store at a time when loading
FILES = "columns"  # the folder of saved arrays in a version folder: one subfolder per save
POINTER = "columns.json"  # names the live subfolder, with the changelog point it holds (written last)
FORMAT = 1
MAPPED_BYTES = 1 << 16  # smaller arrays are read whole: a map costs a page and a file handle each
# Rows of headroom saved past the last one, so that a version opened from its files takes new documents (and
# chunks) in place, copy-on-write, instead of copying every mapped array at its first write.
HEADROOM = 1 / 8
DENSE = {"kind": (np.int8, 0), "num": (np.float64, np.nan), "code": (np.int32, -1), "present": (bool, False)}
EXTRA = {"extra_row": np.int64, "extra_kind": np.int8, "extra_num": np.float64, "extra_code": np.int32}
# Every metadata element of the chosen documents, one row per (document, field, element); a field whose value has
# no elements ([] or {}) still gives one row (element columns NULL): it is present for ``$exists``. A store with
# the ``doc_values`` side table has the elements already (``FIELDS`` + ``VALUES``: one JSON parse a document
# instead of one a field); ``ELEMENTS`` is for a store written before it (read-only).
FIELDS = "SELECT d.rid, f.key, NULL, NULL, NULL FROM documents d, json_each(d.metadata) f WHERE "
VALUES = "SELECT e.doc_rid, e.field, e.type, e.value, e.num FROM doc_values e WHERE "
ELEMENTS = f"""
SELECT d.rid, f.key, e.type, e.value,
       CASE WHEN e.type = 'text' AND e.value GLOB '{DATE_SHAPE}' THEN julianday(e.value) END
FROM documents d, json_each(d.metadata) f
LEFT JOIN json_each(d.metadata, '$."' || f.key || '"') e ON typeof(e.key) <> 'text'
WHERE """


class Unsupported(Exception):
    """A filter the columns cannot evaluate exactly (an integer past 2**53): the SQL path answers it."""


class FieldColumn:
    """One metadata field over the document rows, with its overflow list of further list elements."""

    def __init__(self, capacity: int):
        self.kind = np.zeros(capacity, np.int8)
        self.num = np.full(capacity, np.nan)
        self.code = np.full(capacity, -1, np.int32)
        self.present = np.zeros(capacity, bool)
        self.extra_row = np.zeros(0, np.int64)  # 0: a dead element (no document has row 0)
        self.extra_kind = np.zeros(0, np.int8)
        self.extra_num = np.zeros(0)
        self.extra_code = np.zeros(0, np.int32)
        self.inexact = False  # holds an integer a float64 cannot
        self.dead = 0  # overflow elements of rows read again since (row 0), dropped by ``compact``

    def grow(self, capacity: int) -> None:
        self.kind = _resized(self.kind, capacity, 0)
        self.num = _resized(self.num, capacity, np.nan)
        self.code = _resized(self.code, capacity, -1)
        self.present = _resized(self.present, capacity, False)

    def clear(self, rows: np.ndarray) -> None:
        self.kind[rows], self.num[rows], self.code[rows], self.present[rows] = NONE, np.nan, -1, False
        if len(self.extra_row):
            gone = np.isin(self.extra_row, rows)
            self.dead += int(np.count_nonzero(gone))
            self.extra_row[gone] = 0

    def any(self, size: int, condition) -> np.ndarray:
        """Rows any of whose elements satisfies ``condition(kind, num, code)`` (a vectorised predicate)."""
        hit = condition(self.kind[:size], self.num[:size], self.code[:size])
        if len(self.extra_row):
            extra = condition(self.extra_kind, self.extra_num, self.extra_code)
            hit[self.extra_row[extra]] = True
        return hit

    def elements(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """(row, kind, num, code) of every element of the rows marked in the boolean ``rows``."""
        dense = np.flatnonzero(rows & (self.kind[: len(rows)] != NONE))
        extra = (
            np.flatnonzero((self.extra_row > 0) & rows[self.extra_row]) if len(self.extra_row) else dense[:0]
        )
        return (
            np.concatenate([dense, self.extra_row[extra]]),
            np.concatenate([self.kind[dense], self.extra_kind[extra]]),
            np.concatenate([self.num[dense], self.extra_num[extra]]),
            np.concatenate([self.code[dense], self.extra_code[extra]]),
        )

    def compact(self) -> None:
        if self.dead > 1024 and self.dead > len(self.extra_row) // 2:
            live = self.extra_row > 0
            self.dead = 0
            self.extra_row, self.extra_kind = self.extra_row[live], self.extra_kind[live]
            self.extra_num, self.extra_code = self.extra_num[live], self.extra_code[live]

    def arrays(self, rows: int) -> dict[str, np.ndarray]:
        """Every array by name, the dense ones ``rows`` long (cut or padded with their empty value)."""
        dense = {name: _resized(getattr(self, name), rows, fill) for name, (_, fill) in DENSE.items()}
        return dense | {name: getattr(self, name) for name in EXTRA}

    def nbytes(self) -> int:
        arrays = (
            self.kind,
            self.num,
            self.code,
            self.present,
            self.extra_row,
            self.extra_kind,
            self.extra_num,
        )
        return sum(a.nbytes for a in arrays) + self.extra_code.nbytes


@dataclass
class Update:
    """What a run of changelog entries changed, read from the store outside the index's write lock."""

    removed_chunks: np.ndarray
    added_chunks: np.ndarray  # (chunk id, row) pairs
    alive: np.ndarray  # the rows of the changed documents that exist now (the others: found by their chunks)
    elements: list[tuple] = field(default_factory=list)


class Columns:
    def __init__(self) -> None:
        self.capacity = 1
        self.size = 1  # rows 0 .. size - 1 (row ids are the store's rids, from 1)
        self.alive = np.zeros(1, bool)
        self.chunk_row = np.zeros(0, np.int64)  # chunk id -> its document's row (0: none)
        self.fields: dict[str, FieldColumn] = {}
        self.codes: dict[str, int] = {}
        self.texts: list[str] = []

    # ---- loading and following the store --------------------------------------------------------------

    @classmethod
    def load(cls, store: DocumentStore) -> Columns:
        columns = cls()
        top = store.query("SELECT MAX(rid) FROM documents").fetchone()[0] or 0
        columns._reserve(top + 1)
        for start in range(0, top + 1, PAGE):
            rows = store.query("SELECT rid FROM documents WHERE rid > ? AND rid <= ?", (start, start + PAGE))
            columns.alive[[r[0] for r in rows]] = True
            columns._fill(_elements(store, "rid > ? AND {}rid <= ?", (start, start + PAGE)))
        pairs = np.array(store.query("SELECT id, doc_rid FROM chunks").fetchall(), np.int64).reshape(-1, 2)
        columns._map_chunks(pairs)
        return columns

    def save(self, folder: Path, seq: int) -> None:
        """Write the arrays as of changelog point ``seq`` into a new subfolder of ``folder/columns`` (each file
        fsync'd, then the subfolder renamed into place), then ``columns.json`` naming it (atomically), then
        drop the older subfolders. Files are never rewritten in place: another process may have them mapped."""
        parent = folder / FILES
        parent.mkdir(exist_ok=True)
        for stale in parent.glob(".*.tmp"):  # a save killed midway (only the writer saves)
            shutil.rmtree(stale, ignore_errors=True)
        name = f"{seq}-{secrets.token_hex(4)}"
        temporary = parent / f".{name}.tmp"
        temporary.mkdir()
        try:
            for file, array in self._arrays().items():
                _save_array(temporary / f"{file}.npy", array)
            _save_bytes(temporary / "texts.json", json.dumps(self.texts).encode())
            fsync_dir(temporary)
            os.replace(temporary, parent / name)
            fsync_dir(parent)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        fields = [{"name": n, "inexact": c.inexact, "dead": c.dead} for n, c in self.fields.items()]
        pointer = {"format": FORMAT, "folder": name, "synced_seq": seq, "size": self.size, "fields": fields}
        atomic_write(folder / POINTER, json.dumps(pointer).encode())
        for older in parent.iterdir():
            if older.name != name and not older.name.startswith("."):
                shutil.rmtree(older, ignore_errors=True)

    @classmethod
    def save_from_store(cls, store: DocumentStore, folder: Path) -> None:
        """A new version's columns (a build, a restore), saved beside its FAISS so its first open maps them."""
        cls.load(store).save(folder, store.max_seq())

    def _arrays(self) -> dict[str, np.ndarray]:
        rows = _with_headroom(self.size)
        mapped = np.flatnonzero(self.chunk_row)
        arrays = {
            "alive": _resized(self.alive, rows, False),
            "chunk_row": _resized(
                self.chunk_row, _with_headroom(int(mapped[-1]) + 1 if len(mapped) else 0), 0
            ),
        }
        for number, column in enumerate(self.fields.values()):
            arrays |= {f"{number}.{name}": array for name, array in column.arrays(rows).items()}
        return arrays

    @classmethod
    def open(cls, folder: Path) -> tuple[Columns, int]:
        """The columns saved in ``folder`` and the changelog point they hold, their arrays mapped
        copy-on-write. ``FileNotFoundError`` when none were saved; ``DamagedFile`` when they do not read back
        whole (the store holds everything: the caller loads them from it)."""
        for attempt in range(2):  # the writer may replace them between the pointer's read and the files'
            try:
                pointer = json.loads((folder / POINTER).read_bytes())
            except FileNotFoundError:
                raise
            except (OSError, ValueError) as exc:
                raise DamagedFile(f"{folder / POINTER} does not read back: {exc}") from exc
            try:
                return cls._mapped(folder / FILES / pointer["folder"], pointer), int(pointer["synced_seq"])
            except FileNotFoundError as exc:
                if attempt:
                    raise DamagedFile(f"the columns saved in {folder} are missing: {exc}") from exc
            except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
                raise DamagedFile(f"the columns saved in {folder} do not read back: {exc}") from exc
        raise AssertionError("unreachable: the second attempt returns or raises")

    @classmethod
    def _mapped(cls, saved: Path, pointer: dict[str, Any], texts: list[str] | None = None) -> Columns:
        if pointer["format"] != FORMAT:
            raise ValueError(f"format {pointer['format']}, this code reads {FORMAT}")
        columns = cls()
        columns.alive = _load_array(saved / "alive.npy", bool)
        columns.capacity, columns.size = len(columns.alive), int(pointer["size"])
        if not 1 <= columns.size <= columns.capacity:
            raise ValueError(f"{columns.size} rows saved in arrays of {columns.capacity}")
        columns.chunk_row = _load_array(saved / "chunk_row.npy", np.int64)
        for number, described in enumerate(pointer["fields"]):
            column = FieldColumn(0)
            for name, (dtype, _) in DENSE.items():
                setattr(column, name, _load_array(saved / f"{number}.{name}.npy", dtype, columns.capacity))
            for name, dtype in EXTRA.items():
                setattr(column, name, _load_array(saved / f"{number}.{name}.npy", dtype))
            extras = {len(getattr(column, name)) for name in EXTRA}
            if len(extras) != 1 or not (column.extra_row < columns.capacity).all():
                raise ValueError(f"the overflow list of field {described['name']!r} is damaged")
            column.inexact, column.dead = bool(described["inexact"]), int(described["dead"])
            columns.fields[str(described["name"])] = column
        columns.texts = json.loads((saved / "texts.json").read_bytes()) if texts is None else texts
        columns.codes = {text: code for code, text in enumerate(columns.texts)}
        return columns

    def remapped(self, folder: Path) -> Columns:
        """These columns as just saved in ``folder``, mapped again: the pages this process changed or copied
        since the last open (growth, copy-on-write) are let go. The text dictionary is shared, not re-read."""
        pointer = json.loads((folder / POINTER).read_bytes())
        mapped = self._mapped(folder / FILES / pointer["folder"], pointer, self.texts)
        mapped.codes = self.codes
        return mapped

    @staticmethod
    def read_changes(store: DocumentStore, changes: list[tuple[int, str, int, str]]) -> Update:
        final: dict[int, str] = {}
        for _, _, chunk_id, op in changes:
            final[chunk_id] = op
        removed = np.array([c for c, op in final.items() if op == "-"], np.int64)
        added = [c for c, op in final.items() if op == "+"]
        pairs = store.query(
            "SELECT id, doc_rid FROM chunks WHERE id IN (SELECT value FROM json_each(?))", (_json(added),)
        ).fetchall()
        doc_ids = list(dict.fromkeys(doc_id for _, doc_id, _, _ in changes))
        current = store.query(
            "SELECT rid FROM documents WHERE id IN (SELECT value FROM json_each(?))", (_json(doc_ids),)
        ).fetchall()
        alive = np.array([r[0] for r in current], np.int64)
        elements = _elements(store, "rid IN (SELECT value FROM json_each(?))", (_json(alive.tolist()),))
        return Update(removed, np.array(pairs, np.int64).reshape(-1, 2), alive, elements)

    def apply(self, update: Update) -> None:
        """Caller holds the index's write lock. Idempotent: each touched row is read again whole."""
        removed = update.removed_chunks[update.removed_chunks < len(self.chunk_row)]
        rows = np.union1d(update.alive, self.chunk_row[removed])  # a deleted document: found by its chunks
        rows = rows[(rows > 0) & (rows < self.size)]
        self.chunk_row[removed] = 0
        self._reserve(int(max(update.alive.max(initial=0), update.added_chunks[:, 1].max(initial=0))) + 1)
        self.alive[rows] = False
        for column in self.fields.values():
            column.clear(rows)
            column.compact()
        self.alive[update.alive] = True
        self._fill(update.elements)
        self._map_chunks(update.added_chunks)

    def _reserve(self, size: int) -> None:
        self.size = max(self.size, size)
        if size > self.capacity:
            self.capacity = max(size, 2 * self.capacity)
            self.alive = _resized(self.alive, self.capacity, False)
            for column in self.fields.values():
                column.grow(self.capacity)

    def _map_chunks(self, pairs: np.ndarray) -> None:
        if len(pairs):
            top = int(pairs[:, 0].max()) + 1
            if top > len(self.chunk_row):
                self.chunk_row = _resized(self.chunk_row, max(top, 2 * len(self.chunk_row)), 0)
            self.chunk_row[pairs[:, 0]] = pairs[:, 1]

    def _fill(self, found: list[tuple]) -> None:
        """Rows (rid, field, type, value, instant) from ``_elements`` into the columns."""
        if not found:
            return
        rows, names, types, values, instants = zip(*found, strict=True)
        rows_array = np.array(rows, np.int64)
        kinds = np.array([KINDS.get(t, OTHER if t else NONE) for t in types], np.int8)
        numbers = np.array(
            [
                v if k == NUMBER else i if i is not None else np.nan
                for k, v, i in zip(kinds, values, instants, strict=True)
            ],
            np.float64,
        )
        codes = np.array(
            [self._code(v) if k == TEXT else -1 for k, v in zip(kinds, values, strict=True)], np.int32
        )
        wide = {
            n for n, k, v in zip(names, kinds, values, strict=True) if k == NUMBER and abs(v) > EXACT_INTEGER
        }
        names_array = np.array(names, object)
        for name in dict.fromkeys(names):
            column = self.fields.get(name)
            if column is None:
                column = self.fields[name] = FieldColumn(self.capacity)
            column.inexact |= name in wide
            mine = np.flatnonzero(names_array == name)
            mine = mine[np.argsort(rows_array[mine], kind="stable")]  # a row's elements side by side
            row = rows_array[mine]
            column.present[row] = True
            mine, row = mine[kinds[mine] != NONE], row[kinds[mine] != NONE]
            first = np.ones(len(row), bool)
            first[1:] = row[1:] != row[:-1]
            first &= column.kind[row] == NONE  # an element already there (a replay) stays first
            dense, extra = mine[first], mine[~first]
            column.kind[row[first]], column.num[row[first]] = kinds[dense], numbers[dense]
            column.code[row[first]] = codes[dense]
            column.extra_row = np.concatenate([column.extra_row, row[~first]])
            column.extra_kind = np.concatenate([column.extra_kind, kinds[extra]])
            column.extra_num = np.concatenate([column.extra_num, numbers[extra]])
            column.extra_code = np.concatenate([column.extra_code, codes[extra]])

    def _code(self, text: str) -> int:
        code = self.codes.get(text)
        if code is None:
            code = self.codes[text] = len(self.texts)
            self.texts.append(text)
        return code

    # ---- evaluating a filter ---------------------------------------------------------------------------

    def select(self, tree: Filter) -> Selection:
        """The documents matching ``tree`` (``index.storage.filters``' parsed filter); ``Unsupported`` when the
        columns cannot answer exactly."""
        return Selection(self, self.mask(tree) & self.alive[: self.size], tree)

    def mask(self, node: Filter) -> np.ndarray:
        """The rows ``node`` holds for, alive or not: ``to_sql``'s meaning, one vectorised pass per predicate."""
        if isinstance(node, All | Either):  # one running mask: 256 clauses over 1M rows need not be stacked
            every = isinstance(node, All)
            result = np.full(self.size, every)
            for part in node.parts:
                if every:
                    result &= self.mask(part)
                else:
                    result |= self.mask(part)
            return result
        if isinstance(node, Not):
            return ~self.mask(node.part)
        column = self.fields.get(node.field)
        if column is not None and column.inexact:
            raise Unsupported(node.field)
        if isinstance(node, Exists):
            return column.present[: self.size].copy() if column is not None else np.zeros(self.size, bool)
        condition = None
        if column is not None:
            condition = _range(node) if isinstance(node, Range) else self._equality(node)
        return np.zeros(self.size, bool) if condition is None else column.any(self.size, condition)

    def _equality(self, node: Equals):
        if any(isinstance(v, int) and abs(v) > EXACT_INTEGER for v in node.numbers):
            raise Unsupported("a wide integer")
        codes = [self.codes[v] for v in node.texts if v in self.codes]
        flags = [TRUE if flag else FALSE for flag in node.flags]
        numbers, days = list(node.numbers), list(node.days)
        texts = np.zeros(len(self.texts) + 1, bool)  # by code; code -1 (not a text) reads the last, False
        texts[codes] = True

        def condition(kind: np.ndarray, num: np.ndarray, code: np.ndarray) -> np.ndarray:
            hit = _one_of(kind, flags) if flags else np.zeros(len(kind), bool)
            if numbers:
                hit |= (kind == NUMBER) & _one_of(num, numbers)
            if codes:
                hit |= _one_of(code, codes) if len(codes) <= FEW_VALUES else np.take(texts, code)
            if days:
                hit |= (kind == TEXT) & _one_of(num, days)
            return hit

        return condition

    # ---- facets -----------------------------------------------------------------------------------------

    def facets(
        self, documents: np.ndarray, names: list[str], top: int, store: DocumentStore | None = None
    ) -> dict[str, dict[str, Any]]:
        """Per field, over the documents marked in ``documents``: its type, its ``top`` most frequent values
        (each document counted once per value), and the least and greatest number and date. The numbers of a
        field holding an integer past 2**53 are counted from ``store`` (float64 would make 2**60 and 2**60 + 1
        one value)."""
        return {name: self._facet(name, documents, top, store) for name in names}

    def _facet(
        self, name: str, documents: np.ndarray, top: int, store: DocumentStore | None
    ) -> dict[str, Any]:
        column = self.fields.get(name)
        if column is None:
            return {"type": None, "documents": 0, "values": [], "numbers": None, "dates": None}
        rows, kind, num, code = column.elements(documents)
        counted: list[tuple[Any, int]] = []
        numbers, texts = kind == NUMBER, kind == TEXT
        span = _span(num[numbers], num[numbers], _number)
        if numbers.any() and column.inexact and store is not None:
            exact = _exact_numbers(store, name, documents)
            counted += list(exact.items())
            span = {"min": min(exact), "max": max(exact)} if exact else None
        elif numbers.any():
            pairs = np.unique(np.stack([rows[numbers].astype(np.float64), num[numbers]]), axis=1)
            values, counts = np.unique(pairs[1], return_counts=True)
            counted += [(_number(v), int(c)) for v, c in zip(values, counts, strict=True)]
        if texts.any():
            pairs = np.unique(np.stack([rows[texts], code[texts].astype(np.int64)]), axis=1)
            values, counts = np.unique(pairs[1], return_counts=True)
            counted += [(self.texts[v], int(c)) for v, c in zip(values, counts, strict=True)]
        for flag, value in ((TRUE, True), (FALSE, False)):
            if (kind == flag).any():
                counted.append((value, len(np.unique(rows[kind == flag]))))
        counted.sort(key=_facet_order)
        dates = texts & ~np.isnan(num)
        names = {NUMBER: "number", TRUE: "boolean", FALSE: "boolean", OTHER: "other"}
        kinds = {names[k] for k in np.unique(kind) if k != TEXT}
        if texts.any():
            kinds.add("date" if dates.sum() == texts.sum() else "string")
        return {
            "type": kinds.pop() if len(kinds) == 1 else "mixed" if kinds else None,
            "documents": int(len(np.unique(rows))),
            "values": [{"value": v, "count": c} for v, c in counted[:top]],
            "numbers": span,
            "dates": _span(num[dates], code[dates], lambda c: self.texts[int(c)]),
        }

    def nbytes(self) -> int:
        return self.alive.nbytes + self.chunk_row.nbytes + sum(c.nbytes() for c in self.fields.values())


class Selection:
    """A filter's matches: documents (a mask over rows), and lazily the chunks (a mask over chunk ids): what
    every search mode consumes (``OpenVersion.select``)."""

    def __init__(self, columns: Columns, documents: np.ndarray, tree: Filter):
        self.documents = documents
        self.filter = tree  # for what must ask SQL: the FTS5 fallback, rows read ahead of the columns
        self._chunk_row = columns.chunk_row

    @cached_property
    def chunks(self) -> np.ndarray:
        # Row 0 (no document) is never selected. A write landing during the search may point chunks at rows
        # past this selection's mask: ``clip`` maps them to one appended unselected row, in the gather's own
        # pass (a separate clipping pass cost 2-3x as much, the largest filter step of a dense search past 100k chunks).
        return np.take(np.append(self.documents, False), self._chunk_row, mode="clip")

    @cached_property
    def chunk_count(self) -> int:
        return int(np.count_nonzero(self.chunks))

    def chunk_ids(self) -> np.ndarray:
        return np.flatnonzero(self.chunks)


def _one_of(values: np.ndarray, wanted: list) -> np.ndarray:
    """``np.isin`` for a few wanted values as one ``==`` pass each: isin's own table or sort cost 40x one pass on
    a 500k-row column (2.3 ms against 0.06), the largest step of an equality filter. More whole numbers within
    ``TABLE_SPAN`` of each other are looked up in a table indexed by value (100 of them over 100k rows: 0.56 ms
    against isin's 8.0, docs/design-decisions.md)."""
    if len(wanted) > FEW_VALUES:
        return _in_table(values, wanted)
    hit = values == wanted[0]
    for value in wanted[1:]:
        hit |= values == value
    return hit


def _in_table(values: np.ndarray, wanted: list) -> np.ndarray:
    """``np.isin(values, wanted)``, by a table of the span of ``wanted`` when they are whole numbers close
    enough for one (a bool per value); by isin otherwise."""
    numbers = np.asarray(wanted, dtype=np.float64)
    low, high = float(numbers.min()), float(numbers.max())
    if values.dtype.kind != "f" or not np.all(np.floor(numbers) == numbers) or high - low >= TABLE_SPAN:
        return np.isin(values, wanted)
    span = int(high - low) + 1
    table = np.zeros(span + 1, bool)  # the last entry answers every value outside the span: False
    table[(numbers - low).astype(np.int64)] = True
    offset = np.nan_to_num(values - low, nan=-1.0)
    inside = (offset >= 0) & (offset < span) & (np.floor(offset) == offset)
    return np.take(table, np.where(inside, offset, span).astype(np.int64))


def _facet_order(item: tuple[Any, int]) -> tuple:
    """Most documents first; ties by value: numbers by magnitude (as text, 180 sorted before 20), ahead of the
    booleans and texts, those by their text then their type."""
    value, count = item
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (-count, 0, value, "", "")
    return (-count, 1, 0, str(value), type(value).__name__)


def _range(node: Range):
    """The kind and bound a range compares: numbers with numbers, a date operand's instant with date texts;
    None for a null bound (nothing)."""
    if node.bound is None:
        return None
    if isinstance(node.bound, int) and abs(node.bound) > EXACT_INTEGER:
        raise Unsupported("a wide integer")
    kind, bound = (TEXT if node.on_dates else NUMBER), float(node.bound)
    compare = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}[node.sign]

    def condition(kinds: np.ndarray, num: np.ndarray, code: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (kinds == kind) & compare(num, bound)

    return condition


def _span(values: np.ndarray, labels: np.ndarray, label) -> dict[str, Any] | None:
    if not len(values):
        return None
    return {"min": label(labels[np.argmin(values)]), "max": label(labels[np.argmax(values)])}


def _exact_numbers(store: DocumentStore, name: str, documents: np.ndarray) -> dict[int | float, int]:
    """Documents per number of field ``name`` among those marked in ``documents``, as SQLite holds them
    (integers exactly); 1 and 1.0 are one number, as equality has it."""
    if store.values_table:
        sql = "SELECT doc_rid, value FROM doc_values WHERE field = ? AND type IN ('integer', 'real')"
    else:  # a store written before the side table
        sql = """SELECT d.rid, e.value FROM documents d, json_each(d.metadata, '$."' || ? || '"') e
                 WHERE typeof(e.key) <> 'text' AND e.type IN ('integer', 'real')"""
    found = {
        (rid, value) for rid, value in store.query(sql, (name,)) if rid < len(documents) and documents[rid]
    }
    counts: dict[int | float, int] = {}
    for _, value in found:
        shown = _number(value) if isinstance(value, float) else value
        counts[shown] = counts.get(shown, 0) + 1
    return counts


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() and abs(value) <= EXACT_INTEGER else float(value)


def _resized(array: np.ndarray, size: int, fill: Any) -> np.ndarray:
    if len(array) == size:
        return array
    grown = np.full(size, fill, array.dtype)
    grown[: min(len(array), size)] = array[:size]
    return grown


def _with_headroom(rows: int) -> int:
    return rows + int(rows * HEADROOM) + 1024


def _save_array(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())


def _save_bytes(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _load_array(path: Path, dtype: Any, length: int | None = None) -> np.ndarray:
    """A saved 1-d array, mapped copy-on-write when large (a plain ``ndarray`` view of the map, which keeps it
    open); ``ValueError`` when it is not the expected type and length, or shorter than its header says."""
    small = path.stat().st_size < MAPPED_BYTES
    array = np.load(path, mmap_mode=None if small else "c", allow_pickle=False)
    if array.dtype != np.dtype(dtype) or array.ndim != 1 or (length is not None and len(array) != length):
        raise ValueError(f"{path.name}: {array.dtype} x {array.shape}, expected {np.dtype(dtype)} x {length}")
    return array if small else array.view(np.ndarray)


def _elements(store: DocumentStore, where: str, params: tuple) -> list[tuple]:
    """The ``ELEMENTS`` rows of the documents ``where`` picks (a condition on ``rid``, ``{}`` where the alias goes),
    from the side table when the store keeps one."""
    if store.values_table:
        present = store.query(FIELDS + "d." + where.format("d."), params).fetchall()
        values = store.query(VALUES + "e.doc_" + where.format("e.doc_"), params).fetchall()
        return present + values
    return store.query(ELEMENTS + "d." + where.format("d."), params).fetchall()


def _json(values: list) -> str:
    return json.dumps(values)
