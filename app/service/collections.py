"""Collections as the service holds them: each an open index (or why not), its model's name, and the
requests in flight on it, so that a delete lets them finish while new ones get 404.

``default`` is the service's own index (``CLOZE_INDEX``), opened and followed as before collections; the
others live under the data root (``index.collections``) and are opened, followed and dropped as their
folders appear and go (a replica, or a ``cloze collection`` command beside the service, sees the same)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.service.errors import ApiError
from index.collections import DEFAULT_COLLECTION, CollectionInfo
from index.records import ReadOnlyIndex, collection_name_problem

# ``/collections/{name}`` and what lies under it; the same routes without the prefix are ``default``'s.
COLLECTION_ROUTE = re.compile(r"/collections/(?P<name>[^/]+)(?P<route>/.*)?")
DEFAULT_COLLECTION_ROUTES = ("/search", "/documents", "/index/", "/jobs/")
DRAIN_TIMEOUT_S = 30.0  # a delete waits this long for in-flight requests, then closes anyway


@dataclass
class Collection:
    name: str
    model: str | None  # the named embedding model its vectors come from (None: the caller's own vectors)
    path: Path
    info: CollectionInfo | None = None  # None for ``default``: no collection.json, settings say it all
    index: Any = None  # index.SearchIndex, once open
    error: str | None = None  # why it is not open (or, with ``failing``, not readable)
    failing: bool = False  # opened, but the last probe could not read it
    read_only: bool = False
    in_flight: int = 0
    closing: bool = False

    @property
    def status(self) -> str:
        return (
            "ready" if self.index is not None and not self.failing else "failed" if self.error else "opening"
        )

    def require_index(self) -> Any:
        if self.index is None:
            opening = "index is loading" if self.name == DEFAULT_COLLECTION else f"{self.name!r} is opening"
            reason = self.error or opening
            raise ApiError(503, reason, headers={"Retry-After": "2"})
        return self.index

    def writable_index(self) -> Any:
        """The index, for a write: the read-only check (409) comes before anything is embedded or queued."""
        if self.read_only:
            raise ReadOnlyIndex("the index is open read-only: change documents through the indexer")
        return self.require_index()


@dataclass
class CollectionRegistry:
    """The collections served, by name (``default`` first); the lock orders opens, creates and deletes."""

    root: Path
    default: Collection
    limit: int = 100  # collections besides ``default``
    collections: dict[str, Collection] = field(default_factory=dict)
    lifecycle: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.collections.setdefault(DEFAULT_COLLECTION, self.default)

    def names(self) -> list[str]:
        return list(self.collections)

    def others(self) -> list[Collection]:
        return [c for name, c in self.collections.items() if name != DEFAULT_COLLECTION]

    def get(self, name: str, field_name: str = "collection") -> Collection:
        """The collection ``name`` names: 422 for what cannot be a name, 404 for one not served."""
        collection = self.collections.get(name)
        if collection is None or collection.closing:
            if problem := collection_name_problem(name):
                raise ApiError(422, f"{field_name}: {name!r} is not a collection name: {problem}", field_name)
            raise ApiError(404, f"no collection named {name!r}", field_name)
        return collection

    @contextlib.asynccontextmanager
    async def using(self, name: str) -> AsyncIterator[Collection]:
        """The collection, counted in flight while the request uses it."""
        collection = self.get(name)
        collection.in_flight += 1
        try:
            yield collection
        finally:
            collection.in_flight -= 1

    def withdraw(self, name: str) -> Collection:
        """Take a collection out of service for its delete: new requests get 404 from here on."""
        collection = self.get(name, "name")
        collection.closing = True
        self.collections.pop(name, None)
        return collection

    async def drained(self, collection: Collection, timeout: float = DRAIN_TIMEOUT_S) -> bool:
        """Wait for the requests in flight on a withdrawn collection; False if some outlived ``timeout``."""
        deadline = time.monotonic() + timeout
        while collection.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return collection.in_flight == 0


def split_collection_route(path: str) -> tuple[str | None, str]:
    """The collection a path addresses, and the path as the collection's own routes spell it:
    ``/collections/legal/search`` -> ("legal", "/search"), ``/collections/legal`` -> ("legal", ""),
    ``/search`` -> ("default", "/search"); a path about no collection -> (None, path)."""
    match = COLLECTION_ROUTE.fullmatch(path)
    if match:
        return match["name"], match["route"] or ""
    if path == "/search" or path.startswith(DEFAULT_COLLECTION_ROUTES):
        return DEFAULT_COLLECTION, path
    return None, path
