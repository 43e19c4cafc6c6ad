"""Metadata filters: a request's JSON parsed once into a typed tree (``parse_filter``), and the tree as a SQL
``WHERE`` clause over ``documents d`` with bound parameters only (``to_sql``); ``index.storage.columns``
evaluates the same tree over the in-memory columns, and the oracle tests hold the two backends to each other.

The grammar is MongoDB's and Chroma's JSON shape. A filter is an object; its entries all hold (AND):

- ``{"field": value}``: equality; a list value means "any of" (``$in``), as before operators existed.
- ``{"field": {"$op": operand, ...}}``: ``$eq``, ``$ne``, ``$in``, ``$nin``, ``$gt``, ``$gte``, ``$lt``, ``$lte``,
  ``$exists`` and ``$not`` (an operator object or a value, negated); several operators in one object all hold.
- ``{"$and": [filter, ...]}``, ``{"$or": [filter, ...]}`` (non-empty lists), ``{"$not": filter}``.

One rule for scalar and list-valued metadata (``json_each``): a predicate holds when the value, or any element
of a list value, satisfies it, so ``{"tag": "x"}`` matches ``"x"`` and ``["x", "y"]``, and each operator of
an object is tested on its own (``{"$gt": 1, "$lt": 5}`` matches ``[0, 9]``, as in MongoDB). The negations
(``$ne``, ``$nin``, ``$not``) are exactly "not the positive form": they match documents without the field,
and a list none of whose elements equals the value. Equality is typed: ``1`` matches ``1`` and ``1.0``, never
``true`` or ``"1"``; the members of an object value are not elements.

One rule for dates in every operator: an operand that is an ISO-8601 date or date-time (``iso_instant``) is an
instant, in ``$eq``/``$in``/``$ne``/``$nin`` as in ranges: both sides go through SQLite's ``julianday()``
(millisecond precision); a date or date-time without an offset is UTC, a date is its midnight UTC. So
``1969-07-21T20:17:40``, ``...40Z``, ``...22:17:40+02:00`` and ``...40.000`` all equal each other. Ranges compare
numbers as numbers (never booleans). A metadata string that is not such a date, or a number against a date
operand (and a date string against a number), never satisfies a range or a date's equality. A range operand that
is neither a number nor an ISO date is refused (``InvalidFilterValue`` naming the field), never compared as a
string; ``null`` as a range bound matches nothing (MongoDB's reading), so its negation matches everything. A
date-time whose UTC offset SQLite cannot read (past +-14:59, ``date_problem``) is refused, as an operand here
and in metadata at upsert: it could never compare as an instant.

A field no document has is MongoDB's absent field: it matches nothing, its negations everything. A caller that
wants typos refused passes ``known_fields`` (``UnknownFilterField``). Field names are checked with
``metadata_key_problem``. Bounded: nesting depth, clauses, values per list, and what the whole filter binds
(``parse_filter``'s ``max_values``: a field one, a value one).

A new operator is written three times, each next to its kind: its node and its parsing here, its SQL in
``to_sql``, its mask in ``Columns.mask``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sqlite3
import threading
from collections.abc import Iterator, Set
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from index.records import UnknownFilterField, date_problem, metadata_key_problem

INT64 = (-(2**63), 2**63 - 1)
MAX_FILTER_VALUES = 10_000  # in one whole filter: SQLite binds at most 32,766 parameters in one statement
MAX_FILTER_DEPTH = 8  # $and / $or / $not (and a field's operator object) nested inside each other
MAX_FILTER_CLAUSES = 256  # field predicates and boolean operators in one filter
MAX_LIST_VALUES = 1024  # values in one list ($in, $nin, a shorthand list)
COMPARISONS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
FIELD_OPERATORS = {"$eq", "$ne", "$in", "$nin", "$exists", "$not", *COMPARISONS}
# What SQLite's julianday() reads as an ISO date or date-time, and nothing looser (it also reads "now" and
# bare numbers as Julian day numbers): YYYY-MM-DD, optionally THH:MM[:SS[.fff]], optionally Z or +HH:MM.
ISO_INSTANT = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:\d{2})?)?"
)
DATE_SHAPE = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*"  # GLOB: a stored string worth julianday()


class InvalidFilterValue(ValueError):
    """A filter SQLite cannot evaluate as meant: a 65-bit integer, NaN, a range over a string that is not a
    date, an unknown operator, a bound passed. ``field`` is where, as ``filter.<path>``."""

    def __init__(self, field: str, message: str):
        self.field = f"filter.{field}" if field else "filter"
        super().__init__(f"{self.field}: {message}")


# ---- the tree ---------------------------------------------------------------------------------------------
# A field predicate holds when any element of the field's value satisfies it; ``path`` is where the field sits
# in the request (for ``UnknownFilterField``). The negations ($ne, $nin, $exists false) are ``Not`` of these.


@dataclass(frozen=True)
class All:
    parts: tuple[Filter, ...]  # none: every document


@dataclass(frozen=True)
class Either:
    parts: tuple[Filter, ...]  # $or


@dataclass(frozen=True)
class Not:
    part: Filter


@dataclass(frozen=True)
class Exists:
    field: str
    path: str = dataclasses.field(compare=False)


@dataclass(frozen=True)
class Equals:
    """Typed equality with any of the values: numbers with numbers, texts with texts, booleans by type, and
    an ISO instant (its ``julianday``) with every date-shaped text of that instant. No values: nothing."""

    field: str
    path: str = dataclasses.field(compare=False)
    numbers: tuple[int | float, ...] = ()
    texts: tuple[str, ...] = ()
    days: tuple[float, ...] = ()
    flags: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Range:
    """``sign`` (``>``, ``>=``, ``<``, ``<=``) against a number, or against an instant's ``julianday`` over
    date-shaped texts (``on_dates``). ``bound`` None (a null bound): nothing."""

    field: str
    path: str = dataclasses.field(compare=False)
    sign: str
    bound: int | float | None
    on_dates: bool = False


Filter = All | Either | Not | Exists | Equals | Range
EVERYTHING = All(())
Predicate = Exists | Equals | Range


def predicates(node: Filter) -> Iterator[Predicate]:
    """The field predicates of a tree, in the order the request wrote them."""
    if isinstance(node, All | Either):
        for part in node.parts:
            yield from predicates(part)
    elif isinstance(node, Not):
        yield from predicates(node.part)
    else:
        yield node


def check_known_fields(node: Filter, known_fields: Set[str]) -> None:
    """``UnknownFilterField`` naming the path of the first field no document has."""
    for predicate in predicates(node):
        if predicate.field not in known_fields:
            raise UnknownFilterField(
                f"no document has the metadata field {predicate.field!r}", f"filter.{predicate.path}"
            )


# ---- parsing: the request's JSON, checked once, into the tree ----------------------------------------------


def parse_filter(
    raw: dict[str, Any], known_fields: Set[str] | None = None, max_values: int = MAX_FILTER_VALUES
) -> Filter:
    """The tree of a request's filter: ``InvalidFilterValue`` naming the path of what cannot be evaluated as
    meant, bounded as a whole by ``max_values`` (a field counts one, each value one: what the SQL binds).
    ``known_fields`` None: a field no document has matches nothing; a set refuses it (``UnknownFilterField``),
    once the whole filter is known to be within bounds."""
    tree = _Parser(min(max_values, MAX_FILTER_VALUES)).filter(raw, "", 1)
    if known_fields is not None:
        check_known_fields(tree, known_fields)
    return tree


def as_tree(filters: Filter | dict[str, Any] | None) -> Filter | None:
    """A request's filter as a tree, parsed here unless the caller parsed it already (the service does, with its
    own bound); None for no filter or ``{}``."""
    if isinstance(filters, dict):
        return parse_filter(filters) if filters else None
    return filters


@dataclass
class _Parser:
    max_values: int
    clauses: int = 0
    bound: int = 0  # what the filter binds, roughly: a field predicate one (its path), each value one

    def count_clause(self, where: str) -> None:
        self.clauses += 1
        if self.clauses > MAX_FILTER_CLAUSES:
            raise InvalidFilterValue(where, f"more than {MAX_FILTER_CLAUSES} clauses in one filter")

    def count_values(self, where: str, count: int) -> None:
        self.bound += count
        if self.bound > self.max_values:
            raise InvalidFilterValue(
                "",
                f"more than the limit of {self.max_values} fields and values in all (a field one, a value one)",
            )
        if count - 1 > MAX_LIST_VALUES:
            raise InvalidFilterValue(where, f"{count - 1} values in one list, more than {MAX_LIST_VALUES}")

    def filter(self, node: Any, path: str, depth: int) -> Filter:
        if not isinstance(node, dict):
            raise InvalidFilterValue(path, "a filter is a JSON object of fields and $and / $or / $not")
        if depth > MAX_FILTER_DEPTH:
            raise InvalidFilterValue(path, f"nested deeper than {MAX_FILTER_DEPTH} levels")
        if not node and depth > 1:  # an empty object matches everything; many of them still cost a parse each
            self.count_clause(path)
        return _all([self.entry(key, value, _join(path, key), depth) for key, value in node.items()])

    def entry(self, key: str, value: Any, path: str, depth: int) -> Filter:
        if key.startswith("$"):
            self.count_clause(path)
            if key == "$not":
                return Not(self.filter(value, path, depth + 1))
            if key in ("$and", "$or"):
                if not isinstance(value, list) or not value:
                    raise InvalidFilterValue(path, f"{key} takes a non-empty list of filters")
                self.count_values(path, 0)
                if len(value) > MAX_LIST_VALUES:
                    raise InvalidFilterValue(path, f"{len(value)} filters, more than {MAX_LIST_VALUES}")
                parts = [self.filter(item, _join(path, str(i)), depth + 1) for i, item in enumerate(value)]
                return _all(parts) if key == "$and" else Either(tuple(parts))
            raise InvalidFilterValue(path, f"unknown operator {key!r} here (fields, $and, $or, $not)")
        if problem := metadata_key_problem(key):  # named by where it sits: the key itself may be unprintable
            raise InvalidFilterValue(path[: -len(key) - 1] if "." in path else "", problem)
        return self.field_condition(key, value, path, path, depth)

    def field_condition(self, name: str, value: Any, path: str, where: str, depth: int) -> Filter:
        if isinstance(value, dict):
            if not value:
                raise InvalidFilterValue(where, "an empty operator object")
            if depth + 1 > MAX_FILTER_DEPTH:
                raise InvalidFilterValue(where, f"nested deeper than {MAX_FILTER_DEPTH} levels")
            parts: list[Filter] = []
            for op, operand in value.items():
                inner = _join(where, op)
                if op not in FIELD_OPERATORS:
                    raise InvalidFilterValue(
                        inner, f"unknown operator {op!r} ({', '.join(sorted(FIELD_OPERATORS))})"
                    )
                if op == "$not":
                    self.count_clause(inner)
                    parts.append(Not(self.field_condition(name, operand, path, inner, depth + 1)))
                else:
                    parts.append(self.operator(name, path, op, operand, inner))
            return _all(parts)
        return self.operator(name, path, "$in" if isinstance(value, list) else "$eq", value, where)

    def operator(self, name: str, path: str, op: str, operand: Any, where: str) -> Filter:
        self.count_clause(where)
        if op == "$exists":
            if not isinstance(operand, bool):
                raise InvalidFilterValue(where, "$exists takes true or false")
            self.count_values(where, 1)
            return Exists(name, path) if operand else Not(Exists(name, path))
        if op in ("$in", "$nin") and not isinstance(operand, list):
            raise InvalidFilterValue(where, f"{op} takes a list of values")
        values = operand if op in ("$in", "$nin") else [operand]
        self.count_values(where, 1 + len(values))
        if op in COMPARISONS:
            return comparison(name, path, COMPARISONS[op], operand, where)
        for value in values:
            check_value(where, value)
        equals = equality(name, path, values)
        return Not(equals) if op in ("$ne", "$nin") else equals


def comparison(name: str, path: str, sign: str, operand: Any, where: str) -> Range:
    """A range over numbers, or over ISO instants (both sides through SQLite's julianday(), UTC when no
    offset); a null bound matches nothing."""
    if operand is None:
        return Range(name, path, sign, None)
    if isinstance(operand, int | float) and not isinstance(operand, bool):
        check_value(where, operand)
        return Range(name, path, sign, operand)
    if isinstance(operand, str):
        check_value(where, operand)
    if isinstance(operand, str) and iso_instant(operand):
        return Range(name, path, sign, julianday(operand), on_dates=True)
    raise InvalidFilterValue(
        where,
        f"{operand!r} is neither a number nor an ISO-8601 date or date-time (YYYY-MM-DD, "
        "YYYY-MM-DDTHH:MM[:SS[.fff]][Z|+HH:MM]): a range compares numbers or instants, never strings",
    )


def equality(name: str, path: str, values: list[Any]) -> Equals:
    """Equality with any of ``values`` (already checked), sorted by how each compares."""
    days = (julianday(v) for v in values if isinstance(v, str) and iso_instant(v))
    return Equals(
        name,
        path,
        numbers=tuple(v for v in values if isinstance(v, int | float) and not isinstance(v, bool)),
        texts=tuple(v for v in values if isinstance(v, str) and not iso_instant(v)),
        days=tuple(day for day in days if day is not None),  # a day SQLite cannot read equals nothing
        flags=tuple(dict.fromkeys(v for v in values if isinstance(v, bool))),
    )


def iso_instant(text: str) -> bool:
    """Whether a range may compare ``text`` as an instant: SQLite's ISO shapes, and a real calendar date."""
    if not ISO_INSTANT.fullmatch(text):
        return False
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


_DAYS = threading.local()


@lru_cache(maxsize=4096)
def julianday(text: str) -> float | None:
    """SQLite's own reading of an ISO instant, so an operand and a stored date compare exactly as in SQL."""
    conn = getattr(_DAYS, "conn", None)
    if conn is None:
        conn = _DAYS.conn = sqlite3.connect(":memory:")
    return conn.execute("SELECT julianday(?)", (text,)).fetchone()[0]


def check_value(field: str, value: Any) -> None:
    if isinstance(value, str) and (problem := date_problem(value)):
        raise InvalidFilterValue(field, problem)
    if isinstance(value, bool) or isinstance(value, str):
        return
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        raise InvalidFilterValue(field, f"{value} is outside SQLite's 64-bit integers")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidFilterValue(field, f"{value} is not a finite number")
    if not isinstance(value, int | float):
        kind = "null" if value is None else type(value).__name__
        raise InvalidFilterValue(
            field,
            f"a {kind} cannot be compared: values are strings, numbers or booleans ($exists for presence)",
        )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _all(parts: list[Filter]) -> Filter:
    return parts[0] if len(parts) == 1 else All(tuple(parts))


# ---- the SQL backend ----------------------------------------------------------------------------------------


def to_sql(tree: Filter, values_table: bool = False) -> tuple[str, list[Any]]:
    """The WHERE clause over ``documents d`` and its parameters. ``values_table``: the store keeps
    ``doc_values`` (``DocumentStore``): field predicates read it by index instead of parsing every document's
    JSON (``Exists`` still asks the JSON: an object or ``[]`` has no rows)."""
    params: list[Any] = []
    return _sql(tree, values_table, params), params


def _sql(node: Filter, values_table: bool, params: list[Any]) -> str:
    if isinstance(node, All):
        return " AND ".join(f"({_sql(p, values_table, params)})" for p in node.parts) or "1"
    if isinstance(node, Either):
        return " OR ".join(f"({_sql(p, values_table, params)})" for p in node.parts) or "0"
    if isinstance(node, Not):
        return f"NOT ({_sql(node.part, values_table, params)})"
    if isinstance(node, Exists):
        params.append(f'$."{node.field}"')
        return "json_type(d.metadata, ?) IS NOT NULL"
    element, element_params = (_range if isinstance(node, Range) else _equality)(node, values_table)
    if element is None:
        return "0"
    if values_table:  # the same elements, one row each, read through the side table's indexes
        params += [node.field, *element_params]
        return f"d.rid IN (SELECT e.doc_rid FROM doc_values e WHERE e.field = ? AND ({element}))"
    params += [f'$."{node.field}"', *element_params]
    return f"EXISTS (SELECT 1 FROM json_each(d.metadata, ?) e WHERE typeof(e.key) <> 'text' AND ({element}))"


def _range(node: Range, values_table: bool) -> tuple[str | None, list[Any]]:
    """Numbers with numbers; an instant with date-shaped texts, through julianday() (the side table holds each
    one's already, in ``num``)."""
    if node.bound is None:
        return None, []
    if not node.on_dates:
        return f"e.type IN ('integer', 'real') AND e.value {node.sign} ?", [node.bound]
    day = "e.num" if values_table else f"e.value GLOB '{DATE_SHAPE}' AND julianday(e.value)"
    return f"e.type = 'text' AND {day} {node.sign} ?", [node.bound]


def _equality(node: Equals, values_table: bool) -> tuple[str | None, list[Any]]:
    parts: list[str] = []
    if node.numbers:
        parts.append(f"(e.type IN ('integer', 'real') AND e.value IN ({', '.join('?' * len(node.numbers))}))")
    if node.texts:
        parts.append(f"(e.type = 'text' AND e.value IN ({', '.join('?' * len(node.texts))}))")
    if node.days:
        day = "e.num" if values_table else f"e.value GLOB '{DATE_SHAPE}' AND julianday(e.value)"
        parts.append(f"(e.type = 'text' AND {day} IN ({', '.join('?' * len(node.days))}))")
    parts += [f"e.type = '{'true' if flag else 'false'}'" for flag in node.flags]
    return (" OR ".join(parts) or None), [*node.numbers, *node.texts, *node.days]
