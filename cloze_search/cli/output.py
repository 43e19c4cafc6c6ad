"""What the commands a person runs by hand (``cloze``, ``cloze-client``) print: lines to read by default, and with
``--json`` one JSON object for a script. Collections print from one shape (``cloze_search.Collection``) whether they were read
offline or over ``--url``, so ``collection list`` and ``collection show`` agree on what they both report."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, is_dataclass
from typing import Any

LIST_COLUMNS = ("name", "model", "status", "documents", "chunks", "factory", "chunk_window")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")


def emit(args: argparse.Namespace, answer: Any, human: Callable[[Any], str]) -> None:
    """``answer`` as JSON under ``--json`` (dataclasses as their fields), else as ``human`` writes it."""
    print(json.dumps(plain(answer)) if getattr(args, "json", False) else human(answer))


def plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def shown(value: Any) -> str:
    if value is None:
        return "-"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def table(rows: Iterable[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """Aligned columns under upper-case headers."""
    cells = [[column.upper() for column in columns]]
    cells += [[shown(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def fields(record: dict[str, Any]) -> str:
    """``key: value`` lines, the keys aligned; fields with no value are left out."""
    present = {key: value for key, value in record.items() if value is not None}
    width = max((len(key) for key in present), default=0)
    return "\n".join(f"{(key + ':').ljust(width + 1)} {shown(value)}" for key, value in present.items())


def collection_list(collections: list[Any]) -> str:
    if not collections:
        return "no collections"
    return table((_readable(c) for c in collections), LIST_COLUMNS)


def collection_card(collection: Any) -> str:
    return fields(_readable(collection))


def _readable(collection: Any) -> dict[str, Any]:
    """A collection's fields, with what null stands for where a person would not guess it."""
    record = asdict(collection)
    if record["factory"] is None and record["dimension"] is None and record["status"] == "ready":
        record["factory"] = "auto"  # chosen by corpus size at each build
    return record


def one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
