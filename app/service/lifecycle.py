"""The life of every collection, ``default`` included: create, open, follow, probe, refresh stats, close, delete.

One owner for what happens to a collection's index over time, taking what it needs (the collections, the
embedding models that open them, the settings, the metrics). It makes every ``Collection`` (``served``),
``default``'s included, from a ``CollectionInfo``: a ``collection.json`` for the others, the settings for
``default`` (``default_info``). ``default`` differs in three things only: its folder is ``CLOZE_INDEX``, it is
created at its first open, and it is never deleted through the API.

Identity: a collection made by ``create`` carries an incarnation (``collection.json``); a collection deleted
and made again under the same name is another one. A replica compares incarnations, not only versions, and
re-opens one re-created between two polls. A delete withdraws the collection (new requests get 404), waits
for the requests already on it (writes and restores included) and, if some outlive the wait, puts it back
and answers 409: it never closes an index under a write. Its snapshots are moved aside with it
(``<folder>.deleted-<incarnation>``), so a new collection of that name neither lists nor restores them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import faiss
from starlette.concurrency import run_in_threadpool

from app.service.collections import Collection, CollectionRegistry, default_info, snapshot_folder_of
from app.service.errors import ApiError
from app.service.metrics import Metrics
from app.service.model_registry import INDEX_MODEL, ModelRegistry
from app.settings import Settings
from index.collections import (
    DEFAULT_COLLECTION,
    CollectionError,
    CollectionInfo,
    clean_leftovers,
    create_collection,
    delete_collection,
    list_collections,
)
from index.search_index import SearchIndex

log = logging.getLogger("cloze.service")
RELOAD_EVERY_S = 2.0  # how often published versions, new and gone collections and readiness are checked


class Lifecycle:
    def __init__(
        self, collections: CollectionRegistry, models: ModelRegistry, settings: Settings, metrics: Metrics
    ):
        self.collections, self.models, self.settings, self.metrics = collections, models, settings, metrics
        collections.collections[DEFAULT_COLLECTION] = self.served(default_info(INDEX_MODEL))
        self.started = False  # ``start`` has run: every model has been tried, the collections opened
        # Called before a collection closes for good (replication stops its worker there)
        self.before_close: Callable[[Collection], Awaitable[None]] | None = None
        # /metrics reads default's figures, refreshed every round here: a scrape never counts rows.
        for unit in ("documents", "chunks", "vectors"):
            metrics.index_size.labels(unit).set_function(functools.partial(self.default_figure, unit))

    def default_figure(self, unit: str) -> int:
        return self.collections.default.stats.get(unit, 0)

    # ---- opening and following --------------------------------------------------------------------

    async def start(self) -> None:
        """Once the embedding models are loaded: clean what a killed create or delete left (the writer does),
        open the collections on disk, and ``default`` last: ready means every collection has been tried."""
        # One query per search request; concurrency comes from requests. OpenMP threads on a single-query
        # search only add synchronisation (docs/design-decisions.md, "one OpenMP thread for FAISS").
        faiss.omp_set_num_threads(1)
        if not self.settings.index_read_only:
            await run_in_threadpool(clean_leftovers, self.collections.root)
        await self.sync()
        for collection in [*self.collections.others(), self.collections.default]:
            await self.open(collection)
        self.started = True

    async def follow(self) -> None:
        """Every few seconds once ``start`` has run: one ``round``."""
        while True:
            await asyncio.sleep(RELOAD_EVERY_S)
            if self.started:
                await self.round()

    async def round(self) -> None:
        """Serve the collections on disk, then, for each: open it if it is not (retrying a failure), else
        switch to a newly published version, probe it as a search reads it and refresh its figures."""
        await self.sync()
        for collection in list(self.collections.collections.values()):
            with self.collections.held(collection) as held:  # a delete waits for this
                if not held:
                    continue
                if collection.index is None:
                    await self.open(collection)
                else:
                    await self.reload(collection)
                    await self.probe(collection)
                    await self.refresh_stats(collection)

    async def sync(self) -> None:
        """Serve the collections on disk: add new ones, drop those whose folder went or holds another
        incarnation now (deleted, perhaps made again, by another process: a replica sees the writer's)."""
        registry = self.collections
        async with registry.lifecycle:
            on_disk = {info.name: info for info in await run_in_threadpool(list_collections, registry.root)}
            for served in registry.others():
                info = on_disk.get(served.name)
                if info is None or not _same_incarnation(info, served.info):
                    registry.withdraw(served.name)
                    log.info("collection %r went from disk or was made again: reopening", served.name)
                    await registry.drained(served)
                    await self.closing(served)
            for name, info in on_disk.items():
                if name not in registry.collections:
                    registry.collections[name] = self.served(info)

    def served(self, info: CollectionInfo) -> Collection:
        """The collection ``info`` describes, as this service serves it: ``default`` at ``CLOZE_INDEX``, the
        others under the data root."""
        settings = self.settings
        path = Path(settings.index) if info.name == DEFAULT_COLLECTION else self.collections.root / info.name
        return Collection(
            info,
            path,
            read_only=settings.index_read_only,
            replica=settings.replication_role == "replica",
            snapshots=snapshot_folder_of(settings.snapshots_dir, info.name, path),
        )

    async def open(self, collection: Collection) -> None:
        """Open a collection's index with its model's runtime, or for the caller's own vectors what stands for
        one (``default``'s is made when missing); on failure its routes answer 503 saying why, and the next
        round tries again."""
        encoder = collection.info.own_vectors()
        slot = self.models.slots.get(collection.model) if encoder is None and collection.model else None
        if encoder is None and (slot is None or slot.runtime is None):
            why = "is not served here" if slot is None else slot.error or "is loading"
            collection.error = f"collection {collection.name!r}: its model {collection.model!r} {why} ({self.models.served()})"
            return
        try:
            collection.index = await run_in_threadpool(
                SearchIndex.open,
                collection.path,
                encoder or slot.runtime,  # type: ignore[union-attr]
                create=collection.is_default,
                read_only=collection.read_only,
                on_repair=self.metrics.count_repair,
                limits=self.settings.document_limits(),
            )
        except Exception as exc:
            message = f"collection {collection.name!r} failed to open: {exc}"
            if collection.error != message:  # retried every few seconds: log each new failure once
                log.error(message)
            collection.error = message
            return
        if collection.error is not None:
            log.info("collection %r opened after an earlier failure", collection.name)
        collection.error, collection.failing = None, False
        await self.refresh_stats(collection)

    async def reload(self, collection: Collection) -> None:
        try:
            if await run_in_threadpool(collection.index.reload_if_changed):
                log.info("collection %r: switched to a newly published version", collection.name)
        except Exception:
            log.exception("collection %r: reload failed; still serving its previous version", collection.name)

    async def probe(self, collection: Collection) -> None:
        """Readiness follows a read of the index as a search makes it: a replica that answered 500 to every
        filtered search must not say ready."""
        try:
            await run_in_threadpool(collection.index.probe)
        except Exception as exc:
            if not collection.failing:
                log.exception("collection %r cannot be read: not ready until it can", collection.name)
            collection.error = f"collection {collection.name!r} cannot be read: {exc}"
            collection.failing = True
            return
        if collection.failing:
            log.info("collection %r reads again: ready", collection.name)
            collection.failing, collection.error = False, None

    async def refresh_stats(self, collection: Collection) -> None:
        try:
            collection.stats = await run_in_threadpool(collection.index.stats)
        except Exception:  # a version swapped under the count: the next round gets it
            log.debug("collection %r: stats not refreshed", collection.name, exc_info=True)

    # ---- making and removing ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def created(self, info: CollectionInfo, encoder: Any) -> AsyncIterator[Collection]:
        """A new collection, made, served and opened; held in flight while the caller describes it, so a
        delete of the same name that comes right after waits for that."""
        registry = self.collections
        async with registry.lifecycle:
            if info.name in registry.collections:
                raise ApiError(409, f"name: a collection named {info.name!r} exists", "name")
            if len(registry.others()) >= registry.limit:
                raise ApiError(
                    409,
                    f"this service holds {registry.limit} collections, its limit (CLOZE_MAX_COLLECTIONS): "
                    "delete one first",
                    "name",
                )
            try:
                await run_in_threadpool(create_collection, registry.root, info, encoder)
            except CollectionError as exc:
                raise ApiError(exc.status, str(exc), exc.field) from exc
            collection = registry.collections[info.name] = self.served(info)
            await self.open(collection)
            collection.in_flight += 1
        try:
            yield collection
        finally:
            collection.in_flight -= 1

    async def delete(self, name: str, busy: Callable[[str], str | None]) -> None:
        """Withdraw, wait for what runs on it, close, move its snapshots aside, remove it. 409 (and the
        collection back in service) when ``busy`` names work on it or requests outlive the wait."""
        registry = self.collections
        async with registry.lifecycle:
            collection = registry.get(name, "name")
            if (reason := busy(name)) is None:
                registry.withdraw(name)
                drained = await registry.drained(collection)
                reason = busy(name) if drained else f"requests on {name!r} are still running"
                if reason is not None:
                    registry.reinstate(collection)
            if reason is not None:
                raise ApiError(409, f"name: {reason}: try again when that is over", "name")
            await self.closing(collection)
            try:
                await run_in_threadpool(_remove, registry.root, collection)
            except CollectionError as exc:
                raise ApiError(exc.status, str(exc), exc.field) from exc

    async def closing(self, collection: Collection) -> None:
        """Close a withdrawn collection, after what ``before_close`` stops."""
        if self.before_close is not None:
            await self.before_close(collection)
        await run_in_threadpool(close, collection)
        self.collections.closed(collection)

    async def close_all(self) -> None:
        for collection in list(self.collections.collections.values()):
            await run_in_threadpool(close, collection)


def close(collection: Collection) -> None:
    index, collection.index = collection.index, None
    if index is not None:
        index.close()


def _same_incarnation(on_disk: CollectionInfo, served: CollectionInfo) -> bool:
    return (on_disk.incarnation, on_disk.created) == (served.incarnation, served.created)


def _remove(root: Path, collection: Collection) -> None:
    """Snapshots aside first: a crash between the two leaves the collection without its snapshot list, never
    a new collection of that name with the old one's."""
    folder = collection.snapshots
    if folder is not None and folder.is_dir():
        stamp = collection.info.incarnation or secrets.token_hex(4)
        os.rename(folder, folder.with_name(f"{folder.name}.deleted-{stamp}"))
    delete_collection(root, collection.name)
