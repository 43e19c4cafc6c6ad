"""Which route a request reaches and what that route declared: one table read from the app's own routes.

Each route declares, where it is declared, the access it needs and the path parameter that names its
collection (``declare``, kept in its ``openapi_extra``, so OpenAPI shows it as ``x-access``). The access gate,
the request metrics (labelled by the route's template, never the raw path) and the collection dependency
read the declaration through ``RouteTable.resolve``; nothing else describes the URL space.
"""

from __future__ import annotations

from dataclasses import dataclass
from re import Pattern
from typing import Any, Literal

from fastapi.routing import iter_route_contexts
from starlette.routing import BaseRoute, compile_path
from starlette.types import Scope

from index.collections import DEFAULT_COLLECTION

Access = Literal["public", "probe", "operations", "read", "write", "admin"]
UNMATCHED = "unmatched"  # the one metric label of every path no route answers
READING_METHODS = frozenset({"GET", "HEAD"})
# Resolved routes kept across requests: at most this many, each for a matched path of at most this many
# characters. The cache is filled before the key check, so an unbounded key let anyone pin memory.
CACHED_ROUTES = 4096
CACHED_PATH_CHARS = 256


def declare(access: Access, collection: str | None = None, *, streamed_body: bool = False) -> dict[str, Any]:
    """A route's declaration, for its ``openapi_extra``: who may call it (``public``, ``probe``: anyone,
    shown what the caller's key may read (/readyz), ``operations``: /metrics, ``read``, ``write``, ``admin``: a write key not scoped to collections, for creating
    and deleting a collection), for a collection's route the path parameter that names the
    collection (the route mounted without it is ``default``'s), and whether the route streams its body itself
    under a bound of its own (``BodySizeLimit`` then hands it on unread)."""
    return (
        {"x-access": access}
        | ({"x-collection": collection} if collection else {})
        | ({"x-streamed-body": True} if streamed_body else {})
    )


def declare_route(route: BaseRoute, access: Access) -> BaseRoute:
    """The same, for a route FastAPI or Starlette made (the docs pages, the static files, the lane)."""
    route.openapi_extra = declare(access)  # type: ignore[attr-defined]
    return route


@dataclass(frozen=True)
class Resolved:
    """What a request reaches: the access it needs, the collection it addresses (None: no collection's
    route), the route's template (``unmatched`` when none answers it) and whether it streams its body."""

    access: Access
    collection: str | None
    template: str
    streamed_body: bool = False


@dataclass(frozen=True)
class _Entry:
    template: str
    methods: frozenset[str] | None
    regex: Pattern[str]
    convertors: dict[str, Any]
    declaration: dict[str, Any] | None


class RouteTable:
    def __init__(self, routes: list[BaseRoute]):
        self.entries = [_entry(context) for context in self.contexts(routes)]
        self._cache: dict[tuple[str, str], Resolved] = {}

    @staticmethod
    def contexts(routes: list[BaseRoute]) -> list[Any]:
        """Every route as the router matches it, in its order: an included router's with its prefix."""
        return list(iter_route_contexts(routes))

    def undeclared(self) -> list[str]:
        return [entry.template for entry in self.entries if not (entry.declaration or {}).get("x-access")]

    def resolve(self, scope: Scope) -> Resolved:
        """The request's route and declaration; cached in the request's state (asked by the gate, the
        recorder and the collection dependency) and, for matched short paths, across requests."""
        state = scope.setdefault("state", {})
        found = state.get("declared")
        if found is None:
            found = state["declared"] = self.resolve_path(scope["method"], scope["path"])
        return found

    def resolve_path(self, method: str, path: str) -> Resolved:
        """``_resolve``, cached for the short paths a route matches (the hot ones: /embed, /search...);
        an unmatched or long path is resolved again each time, so what a client sends cannot grow the cache."""
        found = self._cache.get((method, path))
        if found is None:
            found = self._resolve(method, path)
            if found.template != UNMATCHED and len(path) <= CACHED_PATH_CHARS:
                # first in, first out: a miss costs one walk of the table
                if len(self._cache) >= CACHED_ROUTES:
                    del self._cache[next(iter(self._cache))]
                self._cache[(method, path)] = found
        return found

    def allowed(self, path: str) -> list[str]:
        """The methods some route takes at ``path`` (every route of that path, not only the first one the
        router found: ``/documents`` is GET's and PUT's), for a 405's ``Allow``."""
        methods = set()
        for entry in self.entries:
            if entry.methods is not None and entry.regex.match(path) is not None:
                methods |= entry.methods
        return sorted(methods)

    def _resolve(self, method: str, path: str) -> Resolved:
        partial = None
        for entry in self.entries:
            match = entry.regex.match(path)
            if match is None:
                continue
            if entry.methods is None or method in entry.methods:
                return _resolved(entry, match, method)
            partial = partial or (entry, match)
        if partial is not None:  # the path exists, the method does not: 405, as that route declared
            return _resolved(*partial, method)
        return Resolved("read" if method in READING_METHODS else "write", None, UNMATCHED)


def _entry(context: Any) -> _Entry:
    regex = getattr(context, "path_regex", None)
    convertors = getattr(context, "param_convertors", None)
    template = context.path_format
    if regex is None:
        regex, template, convertors = compile_path(context.path)
    methods = getattr(context, "methods", None)
    return _Entry(
        template,
        frozenset(methods) if methods else None,
        regex,
        convertors or {},
        getattr(context, "openapi_extra", None),
    )


def _resolved(entry: _Entry, match: Any, method: str) -> Resolved:
    declaration = entry.declaration or {}
    # An undeclared route needs a write key (tests/app/test_auth_table.py finds none).
    access = declaration.get("x-access", "write")
    parameter = declaration.get("x-collection")
    collection = match.groupdict().get(parameter, DEFAULT_COLLECTION) if parameter else None
    return Resolved(access, collection, entry.template, declaration.get("x-streamed-body", False))
