"""Collections as the service holds them: each an open index (or why not), its model's name, its figures,
and the requests in flight on it, so that a delete lets them finish while new ones get 404.

``default`` is the service's own index (``CLOZE_INDEX``); the others live under the data root
(``index.collections``). ``app.service.lifecycle`` opens, follows, probes and closes every one of them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.service.errors import ApiError
from index.archive import snapshots
from index.collections import DEFAULT_COLLECTION, CollectionInfo
from index.records import ReadOnlyIndex, collection_name_problem


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
    replica: bool = False  # a copy another host's writer ships: its follower changes it, requests do not
    snapshots: Path | None = None  # its snapshot folder (``snapshot_folder_of``)
    stats: dict[str, int] = field(
        default_factory=dict
    )  # documents, chunks, vectors: refreshed in the background
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
        if self.replica:
            raise ReadOnlyIndex(
                "this service is a replica (CLOZE_REPLICATION_ROLE=replica): write to the writer"
            )
        return self.require_index()


@dataclass
class CollectionRegistry:
    """The collections served, by name (``default`` first); the lock orders opens, creates and deletes."""

    root: Path
    default: Collection
    limit: int = 100  # collections besides ``default``
    drain_timeout: float = 30.0  # a delete waits this long for in-flight requests, then refuses (409)
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

    @contextlib.contextmanager
    def held(self, collection: Collection) -> Iterator[bool]:
        """Count ``collection`` in flight while the block runs (False, and not counted, once withdrawn)."""
        if collection.closing:
            yield False
            return
        collection.in_flight += 1
        try:
            yield True
        finally:
            collection.in_flight -= 1

    def withdraw(self, name: str) -> Collection:
        """Take a collection out of service for its delete: new requests get 404 from here on."""
        collection = self.get(name, "name")
        collection.closing = True
        self.collections.pop(name, None)
        return collection

    def reinstate(self, collection: Collection) -> None:
        """Put back a collection whose delete was refused."""
        collection.closing = False
        self.collections[collection.name] = collection

    async def drained(self, collection: Collection) -> bool:
        """Wait for the requests in flight on a withdrawn collection; False if some outlived the wait."""
        deadline = time.monotonic() + self.drain_timeout
        while collection.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return collection.in_flight == 0


def snapshot_folder_of(configured: Path | None, name: str, path: Path) -> Path:
    """Where a collection's snapshots go: ``CLOZE_SNAPSHOTS_DIR`` (the others' in its ``collections/<name>``),
    else ``<folder>.snapshots`` beside the collection's folder."""
    if configured is None:
        return snapshots.default_folder(path)
    if name == DEFAULT_COLLECTION:
        return Path(configured)
    return Path(configured) / "collections" / name
