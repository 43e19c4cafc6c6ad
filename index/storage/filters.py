"""Metadata filters -> a SQL ``WHERE`` clause over ``documents d``, with bound parameters only.

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
(``compile_filters``'s ``max_values``: a field one, a value one).
"""

from __future__ import annotations

import math
import re
from collections.abc import Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from index.records import UnknownFilterField, date_problem, metadata_key_problem

INT64 = (-(2**63), 2**63 - 1)
MAX_FILTER_VALUES = 10_000  # in one whole filter: SQLite binds at most 32,766 parameters in one statement
MAX_FILTER_DEPTH = 8  # $and / $or / $not (and a field's operator object) nested inside each other
MAX_FILTER_CLAUSES = 256  # field predicates and boolean operators in one filter
MAX_LIST_VALUES = 1024  # values in one list ($in, $nin, a shorthand list)
# Post-filtering a broad filter (``ranking.post_filtered``, ``OpenVersion.bm25``) tests unfiltered candidates row
# by row; listing a filter's matches (the side table) and scoring them costs about twice as much per match as
# testing a candidate (100k chunks: ~9 us against ~4 us), so candidates are tested while there are at most
# this many of them per estimated match, and the matches are listed otherwise.
TESTED_PER_MATCH = 2.0
COMPARISONS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
FIELD_OPERATORS = {"$eq", "$ne", "$in", "$nin", "$exists", "$not", *COMPARISONS}
LOGICAL_OPERATORS = {"$and", "$or", "$not"}
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


@dataclass
class _Compiler:
    known_fields: Set[str] | None
    max_values: int
    values_table: bool = False  # predicates over the store's ``doc_values`` (indexed) instead of json_each
    params: list[Any] = field(default_factory=list)
    clauses: int = 0
    bound: int = 0  # what the filter binds, roughly: a field predicate one (its path), each value one
    unknown: tuple[str, str] | None = None  # the first field no document has, and where

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

    # ---- filter objects -------------------------------------------------------------------------------

    def filter(self, node: Any, path: str, depth: int) -> str:
        if not isinstance(node, dict):
            raise InvalidFilterValue(path, "a filter is a JSON object of fields and $and / $or / $not")
        if depth > MAX_FILTER_DEPTH:
            raise InvalidFilterValue(path, f"nested deeper than {MAX_FILTER_DEPTH} levels")
        if not node and depth > 1:  # an empty object matches everything; many of them still cost a parse each
            self.count_clause(path)
        parts = [self.entry(key, value, _join(path, key), depth) for key, value in node.items()]
        return _all(parts)

    def entry(self, key: str, value: Any, path: str, depth: int) -> str:
        if key.startswith("$"):
            self.count_clause(path)
            if key == "$not":
                return f"NOT ({self.filter(value, path, depth + 1)})"
            if key in ("$and", "$or"):
                if not isinstance(value, list) or not value:
                    raise InvalidFilterValue(path, f"{key} takes a non-empty list of filters")
                self.count_values(path, 0)
                if len(value) > MAX_LIST_VALUES:
                    raise InvalidFilterValue(path, f"{len(value)} filters, more than {MAX_LIST_VALUES}")
                parts = [self.filter(item, _join(path, str(i)), depth + 1) for i, item in enumerate(value)]
                return _all(parts) if key == "$and" else "(" + " OR ".join(f"({p})" for p in parts) + ")"
            raise InvalidFilterValue(path, f"unknown operator {key!r} here (fields, $and, $or, $not)")
        if problem := metadata_key_problem(key):  # named by where it sits: the key itself may be unprintable
            raise InvalidFilterValue(path[: -len(key) - 1] if "." in path else "", problem)
        if self.known_fields is not None and key not in self.known_fields and self.unknown is None:
            self.unknown = (key, path)  # raised once the whole filter is known to be within bounds
        return self.field_condition(key, value, path, depth)

    # ---- one field --------------------------------------------------------------------------------

    def field_condition(self, name: str, value: Any, path: str, depth: int) -> str:
        if isinstance(value, dict):
            if not value:
                raise InvalidFilterValue(path, "an empty operator object")
            if depth + 1 > MAX_FILTER_DEPTH:
                raise InvalidFilterValue(path, f"nested deeper than {MAX_FILTER_DEPTH} levels")
            parts = []
            for op, operand in value.items():
                where = _join(path, op)
                if op not in FIELD_OPERATORS:
                    raise InvalidFilterValue(
                        where, f"unknown operator {op!r} ({', '.join(sorted(FIELD_OPERATORS))})"
                    )
                if op == "$not":
                    self.count_clause(where)
                    parts.append(f"NOT ({self.field_condition(name, operand, where, depth + 1)})")
                else:
                    parts.append(self.operator(name, op, operand, where))
            return _all(parts)
        if isinstance(value, list):
            return self.operator(name, "$in", value, path)
        return self.operator(name, "$eq", value, path)

    def operator(self, name: str, op: str, operand: Any, where: str) -> str:
        self.count_clause(where)
        json_path = f'$."{name}"'
        if op == "$exists":
            if not isinstance(operand, bool):
                raise InvalidFilterValue(where, "$exists takes true or false")
            self.count_values(where, 1)
            self.params.append(json_path)
            return f"json_type(d.metadata, ?) IS {'NOT ' if operand else ''}NULL"
        if op in ("$in", "$nin"):
            if not isinstance(operand, list):
                raise InvalidFilterValue(where, f"{op} takes a list of values")
            values = operand
        else:
            values = [operand]
        self.count_values(where, 1 + len(values))
        if op in COMPARISONS and operand is None:
            return "0"  # a null bound: nothing is greater or less than null
        if op in COMPARISONS:
            element, element_params = comparison(COMPARISONS[op], operand, where, self.values_table)
        else:
            for value in values:
                check_value(where, value)
            if not values:
                return "0" if op == "$in" else "1"
            element, element_params = equality(values, self.values_table)
        if self.values_table:  # the same elements, one row each, read through the side table's indexes
            self.params += [name, *element_params]
            exists = f"d.rid IN (SELECT e.doc_rid FROM doc_values e WHERE e.field = ? AND ({element}))"
        else:
            self.params += [json_path, *element_params]
            exists = f"EXISTS (SELECT 1 FROM json_each(d.metadata, ?) e WHERE typeof(e.key) <> 'text' AND ({element}))"
        return f"NOT {exists}" if op in ("$ne", "$nin") else exists


def comparison(sign: str, operand: Any, where: str, values_table: bool = False) -> tuple[str, list[Any]]:
    """A range over numbers, or over ISO instants (both sides through julianday(), UTC when no offset; the side
    table holds each date-shaped string's julianday() already, in ``num``)."""
    if isinstance(operand, int | float) and not isinstance(operand, bool):
        check_value(where, operand)
        return f"e.type IN ('integer', 'real') AND e.value {sign} ?", [operand]
    if isinstance(operand, str):
        check_value(where, operand)
    if isinstance(operand, str) and iso_instant(operand):
        if values_table:
            return f"e.type = 'text' AND e.num {sign} julianday(?)", [operand]
        return (
            f"e.type = 'text' AND e.value GLOB '{DATE_SHAPE}' AND julianday(e.value) {sign} julianday(?)",
            [operand],
        )
    raise InvalidFilterValue(
        where,
        f"{operand!r} is neither a number nor an ISO-8601 date or date-time (YYYY-MM-DD, "
        "YYYY-MM-DDTHH:MM[:SS[.fff]][Z|+HH:MM]): a range compares numbers or instants, never strings",
    )


def equality(values: list[Any], values_table: bool = False) -> tuple[str, list[Any]]:
    """Typed equality with any of ``values``: numbers with numbers, strings with strings, booleans by type, and
    an ISO date or date-time with every metadata string of the same instant (the ranges' rule)."""
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    instants = [v for v in values if isinstance(v, str) and iso_instant(v)]
    texts = [v for v in values if isinstance(v, str) and not iso_instant(v)]
    parts: list[str] = []
    if numbers:
        parts.append(f"(e.type IN ('integer', 'real') AND e.value IN ({', '.join('?' * len(numbers))}))")
    if texts:
        parts.append(f"(e.type = 'text' AND e.value IN ({', '.join('?' * len(texts))}))")
    if instants:
        days = ", ".join(["julianday(?)"] * len(instants))
        stored = "e.num" if values_table else f"e.value GLOB '{DATE_SHAPE}' AND julianday(e.value)"
        parts.append(f"(e.type = 'text' AND {stored} IN ({days}))")
    parts += [
        f"e.type = '{kind}'" for kind in ("true", "false") if any(v is (kind == "true") for v in values)
    ]
    return " OR ".join(parts), [*numbers, *texts, *instants]


def iso_instant(text: str) -> bool:
    """Whether a range may compare ``text`` as an instant: SQLite's ISO shapes, and a real calendar date."""
    if not ISO_INSTANT.fullmatch(text):
        return False
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def compile_filters(
    filters: dict[str, Any],
    known_fields: Set[str] | None,
    max_values: int = MAX_FILTER_VALUES,
    values_table: bool = False,
) -> tuple[str, list[Any]]:
    """The WHERE clause and its parameters. ``known_fields`` None checks shape and bounds only (a field no
    document has matches nothing); a set refuses such a field (``UnknownFilterField``, naming its path).
    ``values_table``: the store keeps ``doc_values`` (``DocumentStore``): field predicates read it by index
    instead of parsing every document's JSON (``$exists`` still asks the JSON: an object or ``[]`` has no rows)."""
    compiler = _Compiler(known_fields, min(max_values, MAX_FILTER_VALUES), values_table)
    where = compiler.filter(filters, "", 1)
    if compiler.unknown is not None:
        name, path = compiler.unknown
        raise UnknownFilterField(f"no document has the metadata field {name!r}", f"filter.{path}")
    return where, compiler.params


def filter_fields(filters: Any) -> set[str]:
    """Every metadata field a filter names, at any depth (for a caller that refreshes its known fields)."""
    names: set[str] = set()
    stack = [filters]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in LOGICAL_OPERATORS:
                    stack.append(value)
                elif not key.startswith("$"):
                    names.add(key)
    return names


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


def _all(parts: list[str]) -> str:
    if not parts:
        return "1"
    return parts[0] if len(parts) == 1 else " AND ".join(f"({p})" for p in parts)
