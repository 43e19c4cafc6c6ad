"""Checks that depend on settings, and the JSON parser every route reads bodies with; errors name the field.

``StrictJSONRoute`` parses a request body once, refusing what ``json.loads`` lets through by default:
duplicate keys (which value did the client mean?), ``NaN`` / ``Infinity`` (not JSON), lone UTF-16
surrogates (SQLite and the tokenizer cannot encode them), nesting past ``MAX_BODY_DEPTH``, and more values
than ``CLOZE_MAX_BODY_VALUES`` (what parsing, validation and its error list cost grows with).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute

from app.service.errors import ApiError, BodyRejected
from app.settings import Settings
from index.records import InvalidDocument, UnknownFilterField
from index.records import check_metadata as check_document_metadata
from index.storage.filters import Filter, InvalidFilterValue, parse_filter

MAX_BODY_DEPTH = 32  # metadata has its own, lower limit (CLOZE_MAX_METADATA_DEPTH)
MAX_BODY_VALUES = Settings.model_fields["max_body_values"].default
INLINE_PARSE_BYTES = 64 * 1024  # parsed on the event loop below this (a thread hop costs more)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BodyRejected(f"{key}: the key appears twice in one object", key)
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise BodyRejected(f"body: {name} is not a JSON number")


def strict_loads(body: bytes, max_values: int = MAX_BODY_VALUES) -> Any:
    """The body's JSON, refused (422, ``field`` named) when it is not strict JSON or holds more than
    ``max_values`` values. The count comes first, from orjson's C parser, so that no later step (the strict
    parse, the checks, pydantic's validation and its list of errors) ever sees an unbounded body."""
    try:
        count_values(orjson.loads(body), max_values)
    except orjson.JSONDecodeError:
        pass  # the strict parser below names what is wrong (NaN, a 65-bit integer, bad syntax)
    try:
        value = json.loads(body, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError as exc:
        raise BodyRejected(f"body: nested deeper than {MAX_BODY_DEPTH} levels") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, BodyRejected):
            raise
        raise BodyRejected(f"body: not valid JSON: {exc}") from exc
    _check_tree(value)
    return value


def count_values(value: Any, limit: int) -> int:
    """How many JSON values ``value`` holds, refused as soon as the count passes ``limit``."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            raise BodyRejected(f"body: more than {limit} JSON values (CLOZE_MAX_BODY_VALUES)")
        if isinstance(node, dict):
            stack.extend(node.values())
            count += len(node)  # the keys
        elif isinstance(node, list):
            stack.extend(node)
    return count


async def parse_body(body: bytes, max_values: int) -> Any:
    """``strict_loads``, in a worker thread for a body big enough to hold the event loop up."""
    if len(body) <= INLINE_PARSE_BYTES:
        return strict_loads(body, max_values)
    return await run_in_threadpool(strict_loads, body, max_values)


def _check_tree(value: Any) -> None:
    """Depth and encodable strings, without recursion (the walk is as long as the body, no longer)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        where = path or "body"  # paths read as FastAPI's validation errors do: "0.metadata.tags"
        if depth > MAX_BODY_DEPTH:
            raise BodyRejected(f"{where}: nested deeper than {MAX_BODY_DEPTH} levels", where)
        if isinstance(node, str):
            _check_string(node, where)
        elif isinstance(node, float) and not math.isfinite(node):  # 1e999 parses as inf
            raise BodyRejected(f"{where}: {node} is not a finite number", where)
        elif isinstance(node, dict):
            for key, child in node.items():
                _check_string(key, where)
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(node, list):
            stack.extend(
                (child, f"{path}.{i}" if path else str(i), depth + 1) for i, child in enumerate(node)
            )


def _check_string(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BodyRejected(
            f"{where}: a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x})", where
        ) from exc


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await parse_body(await self.body(), self.app.state.settings.max_body_values)
        return self._json


class StrictJSONRoute(APIRoute):
    """Every route of a router made with ``route_class=StrictJSONRoute`` parses its body strictly."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler


def text_list(value: str | list[str], field: str, settings: Settings) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise ApiError(422, f"{field}: empty list: send at least one text", field)
    if len(texts) > settings.max_inputs:
        raise ApiError(
            422, f"{field}: {len(texts)} texts, more than the limit of {settings.max_inputs}", field
        )
    for position, text in enumerate(texts):
        where = field if isinstance(value, str) else f"{field}[{position}]"
        if not text.strip():
            raise ApiError(422, f"{where}: empty text", where)
        if len(text) > settings.max_chars:
            raise ApiError(
                422, f"{where}: {len(text)} characters, over the limit of {settings.max_chars}", where
            )
    return texts


def check_metadata(metadata: dict[str, Any], where: str, settings: Settings) -> None:
    """``index.records.check_metadata`` with the service's limits, as a 422 naming the field: the same check a
    restore's import makes of every document in the archive."""
    try:
        check_document_metadata(metadata, where, settings.document_limits())
    except InvalidDocument as exc:
        raise ApiError(422, str(exc), exc.field) from exc


def check_filter(filters: dict[str, Any] | None, settings: Settings) -> Filter | None:
    """The filter parsed once (``index.storage.filters.parse_filter``), before any model or index work: its
    grammar, values and bounds, as a whole by CLOZE_MAX_FILTER_VALUES (a field counts one, each value one: what
    the query binds), and every field name one that can be filtered on exactly. Unknown fields are the index's to
    say. The tree is what the index is handed; None for no filter."""
    if not filters:
        return None
    try:
        return parse_filter(filters, None, settings.max_filter_values)
    except InvalidFilterValue as exc:
        raise ApiError(422, str(exc), exc.field) from exc


async def check_filter_fields(index: Any, filters: Filter | None, settings: Settings, pool: Any) -> None:
    """With CLOZE_STRICT_FILTER_FIELDS, a 422 naming a field no document of ``index`` ever had (a typo, most
    likely); without it such a field is MongoDB's absent field and the filter is evaluated."""
    if not (settings.strict_filter_fields and filters):
        return
    try:
        await pool.run(index.check_filter_fields, filters)
    except UnknownFilterField as exc:
        raise ApiError(422, f"{exc.field}: no document has this metadata field", exc.field) from exc
