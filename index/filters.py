"""Metadata filters -> a SQL ``WHERE`` clause over ``documents d``, with bound parameters only.

A scalar is equality, a list is ``in``. ``json_each`` makes one rule for scalar and list-valued metadata:
``{"tag": "x"}`` matches ``tag == "x"`` and also ``tag == ["x", "y"]`` (membership). Field names are
checked against the fields the store has seen, so a typo is an error instead of an empty result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Set
from typing import Any

from index.records import UnknownFilterField, metadata_key_problem

INT64 = (-(2**63), 2**63 - 1)
MAX_FILTER_VALUES = 10_000  # in one whole filter: SQLite binds at most 32,766 parameters in one statement


class InvalidFilterValue(ValueError):
    """A filter value SQLite cannot compare: an integer past 64 bits, NaN, too long a list."""

    def __init__(self, field: str, message: str):
        self.field = f"filter.{field}" if field else "filter"
        super().__init__(f"{self.field}: {message}")


def compile_filters(filters: dict[str, Any], known_fields: Set[str]) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if filter_size(filters) > MAX_FILTER_VALUES:
        raise InvalidFilterValue("", f"{filter_size(filters)} values in all, more than {MAX_FILTER_VALUES}")
    for field, wanted in filters.items():
        if problem := metadata_key_problem(field):
            raise InvalidFilterValue("", problem)
        if field not in known_fields:
            raise UnknownFilterField(f"no document has the metadata field {field!r}")
        values = list(wanted) if isinstance(wanted, list | tuple | set) else [wanted]
        for value in values:
            check_value(field, value)
        if not values:
            clauses.append("0")
            continue
        marks = ", ".join("?" for _ in values)
        clauses.append(f"EXISTS (SELECT 1 FROM json_each(d.metadata, ?) WHERE value IN ({marks}))")
        params += [f'$."{field}"', *[sql_value(v) for v in values]]
    return (" AND ".join(clauses) or "1"), params


def filter_size(filters: dict[str, Any]) -> int:
    """What a filter binds: one per field (its JSON path) plus one per value."""
    return sum(1 + (len(v) if isinstance(v, list | tuple | set) else 1) for v in filters.values())


def check_value(field: str, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        raise InvalidFilterValue(field, f"{value} is outside SQLite's 64-bit integers")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidFilterValue(field, f"{value} is not a finite number")


def sql_value(value: Any) -> Any:
    """A filter value as SQLite compares it with ``json_each``'s ``value`` column."""
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, int | float | str):
        return value
    return json.dumps(value)
