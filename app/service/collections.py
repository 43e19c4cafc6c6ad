"""Collections as the service holds them: each an open index (or why not), its model's name, its figures,
and the requests in flight on it, so that a delete lets them finish while new ones get 404.

``default`` is the service's own index (``CLOZE_INDEX``); the others live under the data root
(``index.collections``). Every one has a ``CollectionInfo``: the others' is their ``collection.json``,
``default``'s is made from the settings (``default_info``). ``app.service.lifecycle`` makes the ``Collection``
of each, and opens, follows, probes and closes every one of them."""

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
    info: CollectionInfo  # its name, its model (None: the caller's own vectors), how it is built
    path: Path
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
    def name(self) -> str:
        return self.info.name

    @property
    def model(self) -> str | None:
        """The named embedding model its vectors come from (None: the caller's own vectors)."""
        return self.info.model

    @property
    def is_default(self) -> bool:
        """The service's own index: made at its first open, never deleted through the API."""
        return self.name == DEFAULT_COLLECTION

    @property
    def status(self) -> str:
        return (
            "ready" if self.index is not None and not self.failing else "failed" if self.error else "opening"
        )

    def require_index(self) -> Any:
        if self.index is None:
            opening = "index is loading" if self.is_default else f"{self.name!r} is opening"
            raise ApiError(503, self.error or opening, headers={"Retry-After": "2"})
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
    """The collections served, by name (``default`` first, once the lifecycle has added it); the lock orders
    opens, creates and deletes."""

    root: Path  # the data root the others live under (``CLOZE_COLLECTIONS_DIR``)
    limit: int = 100  # collections besides ``default``
    drain_timeout: float = 30.0  # a delete waits this long for in-flight requests, then refuses (409)
    collections: dict[str, Collection] = field(default_factory=dict)
    # Out of service while a delete waits for their requests: they still exist until closed, or come back.
    withdrawn: dict[str, Collection] = field(default_factory=dict)
    lifecycle: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def default(self) -> Collection:
        return self.collections[DEFAULT_COLLECTION]

    def names(self) -> list[str]:
        return list(self.collections)

    def others(self) -> list[Collection]:
        """The collections under the data root: every one but ``default``."""
        return [c for c in self.collections.values() if not c.is_default]

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
        self.withdrawn[name] = collection
        return collection

    def reinstate(self, collection: Collection) -> None:
        """Put back a collection whose delete was refused."""
        collection.closing = False
        self.withdrawn.pop(collection.name, None)
        self.collections[collection.name] = collection

    def closed(self, collection: Collection) -> None:
        """A withdrawn collection is closed: it no longer exists here."""
        if self.withdrawn.get(collection.name) is collection:
            del self.withdrawn[collection.name]

    def existing(self) -> list[Collection]:
        """What exists, served or withdrawn for a delete that may yet be refused (what a registry lists)."""
        return [*list(self.collections.values()), *list(self.withdrawn.values())]

    async def drained(self, collection: Collection) -> bool:
        """Wait for the requests in flight on a withdrawn collection; False if some outlived the wait."""
        deadline = time.monotonic() + self.drain_timeout
        while collection.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return collection.in_flight == 0


def default_info(model: str) -> CollectionInfo:
    """``default``'s info: it has no ``collection.json`` (its folder, ``CLOZE_INDEX``, is an index folder made
    by ``cloze index build`` or at its first open); its model is the one ``CLOZE_MODEL`` configures, its build
    options are its manifest's, and it has no creation time or incarnation to report."""
    return CollectionInfo(DEFAULT_COLLECTION, model, created=None)


def snapshot_folder_of(configured: Path | None, name: str, path: Path) -> Path:
    """Where a collection's snapshots go: ``CLOZE_SNAPSHOTS_DIR`` (the others' in its ``collections/<name>``),
    else ``<folder>.snapshots`` beside the collection's folder."""
    if configured is None:
        return snapshots.default_folder(path)
    if name == DEFAULT_COLLECTION:
        return Path(configured)
    return Path(configured) / "collections" / name
