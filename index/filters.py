"""Metadata filters -> a SQL ``WHERE`` clause over ``documents d``, with bound parameters only.

A scalar is equality, a list is ``in``. ``json_each`` makes one rule for scalar and list-valued metadata:
``{"tag": "x"}`` matches ``tag == "x"`` and also ``tag == ["x", "y"]`` (membership). Field names are
checked against the fields the store has seen, so a typo is an error instead of an empty result.
"""

from __future__ import annotations

import json
from collections.abc import Set
from typing import Any

from index.records import UnknownFilterField


def compile_filters(filters: dict[str, Any], known_fields: Set[str]) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for field, wanted in filters.items():
        if field not in known_fields or '"' in field:
            raise UnknownFilterField(f"no document has the metadata field {field!r}")
        values = list(wanted) if isinstance(wanted, list | tuple | set) else [wanted]
        if not values:
            clauses.append("0")
            continue
        marks = ", ".join("?" for _ in values)
        clauses.append(f"EXISTS (SELECT 1 FROM json_each(d.metadata, ?) WHERE value IN ({marks}))")
        params += [f'$."{field}"', *[sql_value(v) for v in values]]
    return (" AND ".join(clauses) or "1"), params


def sql_value(value: Any) -> Any:
    """A filter value as SQLite compares it with ``json_each``'s ``value`` column."""
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, int | float | str):
        return value
    return json.dumps(value)
