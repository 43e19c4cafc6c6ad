"""Replication in the service: every collection's shipper (``CLOZE_REPLICATION_ROLE=writer``) or follower
(``replica``), one worker thread each, under one watchdog; the registry of collections in the bucket
(``index.replication.registry``), which the writer keeps current and a replica mirrors: it creates what the
writer lists and drops what it no longer does. The routes ask it too: ``/readyz`` reports it, writes ask
``admit`` before and ``acknowledge`` after they commit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from starlette.concurrency import run_in_threadpool

from app.service.collections import Collection
from app.service.errors import ApiError
from app.service.lifecycle import Lifecycle
from app.settings import Settings
from index.collections import DEFAULT_COLLECTION, CollectionInfo
from index.replication.bucket import Bucket, BucketUnavailable, Fenced, collection_key
from index.replication.follower import Follower
from index.replication.garbage import Sweeper
from index.replication.registry import Publisher, entry_of, read_listing
from index.replication.shipper import Shipper, writer_identity

log = logging.getLogger("cloze.replication")
Ack = Literal["local", "remote"]
WATCH_EVERY_S = 1.0
RELEASE_WAIT_S = 30.0  # how long a collection's delete waits for its worker's step in progress


@dataclass
class Replicated:
    """One collection's worker and the bucket folder it ships or follows."""

    collection: Collection
    incarnation: str | None  # the writer's (None: ``default``, or a collection made before incarnations)
    worker: Shipper | Follower


def served_index(collection: Collection) -> Callable[[], Any]:
    """What a worker reads its index from: None once a delete withdrew the collection."""
    return lambda: None if collection.closing else collection.index


def stop(worker: Shipper | Follower) -> None:
    """End a worker for good: its thread, and a follower's download threads (they would idle forever)."""
    worker.stop()
    if isinstance(worker, Follower):
        worker.fetch.shutdown(wait=False)


def same_collection(local: CollectionInfo | None, listed: CollectionInfo) -> bool:
    """Whether a local copy is the incarnation the writer lists (one listed without an incarnation, made
    before they were recorded, is known by its name alone)."""
    return local is not None and listed.incarnation in (None, local.incarnation)


class Replication:
    def __init__(self, settings: Settings, engines: Any, lifecycle: Lifecycle):
        self.settings, self.engines, self.lifecycle = settings, engines, lifecycle
        self.role = settings.replication_role
        self.bucket: Bucket | None = None
        self.publisher: Publisher | None = None  # the writer's registry
        self.sweeper: Sweeper | None = None  # the writer's deletion of unlisted collections' folders
        self.workers: dict[str, Replicated] = {}  # by collection name
        self.fenced: str | None = None  # the writer's prefix is held by another writer: nothing ships
        self.registry_error: str | None = None
        self.listing: dict[str, CollectionInfo] | None = None  # a replica's last read of the registry
        self.not_followed: dict[str, str] = {}  # a replica: listed collections it cannot copy, and why
        self.wake = asyncio.Event()
        lifecycle.before_close = self.release

    @property
    def collections(self) -> Any:
        return self.engines.collections

    def work_folder(self) -> Path:
        """Temporary archives, beside the index folder (never inside it: rebuilds and GC own that)."""
        root = Path(self.settings.index).resolve()
        return root.parent / f"{root.name}.replication"

    # ---- the loops ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Once the collections are open: keep a worker per replicated collection and the registry in step
        (every ``CLOZE_REPLICATION_POLL_S``), and restart any worker that falls silent."""
        if self.role == "off":
            return
        while not self.lifecycle.started:
            await asyncio.sleep(0.2)
        settings = self.settings
        self.bucket = await run_in_threadpool(
            Bucket,
            settings.replication_bucket or "",
            settings.replication_endpoint,
            settings.replication_region,
        )
        if self.role == "writer":
            writer_id = await run_in_threadpool(writer_identity, Path(settings.index))
            self.publisher = Publisher(self.bucket, settings.replication_epoch, writer_id)
            if settings.replication_gc_after_s:
                self.sweeper = Sweeper(self.publisher, settings.replication_gc_after_s)
        try:
            await asyncio.gather(self._keep_in_step(), self._watch())
        finally:
            for replicated in self.workers.values():
                stop(replicated.worker)

    async def _keep_in_step(self) -> None:
        while True:
            try:
                await (self._sync_writer() if self.role == "writer" else self._sync_replica())
                self.registry_error = None
            except Fenced as exc:
                self._fence(str(exc))
            except (BucketUnavailable, ValueError) as exc:
                if self.registry_error != str(exc):
                    log.warning("the collections registry: %s", exc)
                self.registry_error = str(exc)
            except Exception as exc:  # logged and retried: the loop must outlive any one failure
                log.exception("replication: keeping the collections in step failed")
                self.registry_error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.settings.replication_poll_s)
            self.wake.clear()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            for replicated in [] if self.fenced else list(self.workers.values()):
                silent = replicated.worker.silent_for()
                if silent > self.settings.replication_watchdog_s:
                    replicated.worker.restart(
                        f"{replicated.collection.name}: silent for {silent:.0f} s (CLOZE_REPLICATION_WATCHDOG_S)"
                    )

    # ---- the writer ------------------------------------------------------------------------------

    async def _sync_writer(self) -> None:
        """A shipper for every collection served; then the registry lists them (bases may follow: a replica
        waits for the first), and the folders of those it stopped listing go once due."""
        if self.fenced:
            return
        for replicated in self.workers.values():
            if isinstance(replicated.worker, Shipper) and replicated.worker.fenced:
                raise Fenced(replicated.worker.fenced)
        assert self.publisher is not None
        await run_in_threadpool(self.publisher.check)  # fenced before shipping anything
        self._forget_gone()
        served = self._served()
        for collection in served:
            self._worker_for(collection)
        listing = {c.name: entry_of(c.info) for c in served if c.name != DEFAULT_COLLECTION and c.info}
        await run_in_threadpool(self.publisher.publish, listing)
        if self.sweeper is not None:
            self.sweeper.when_due()

    def _fence(self, why: str) -> None:
        if self.fenced is None:
            log.error("replication stopped for every collection: %s", why)
        self.fenced = why
        for replicated in self.workers.values():
            stop(replicated.worker)

    def _make_shipper(self, collection: Collection, key: str) -> Shipper:
        settings = self.settings
        assert self.bucket is not None and self.publisher is not None
        return Shipper(
            served_index(collection),
            self.bucket,
            self.bucket.keys(key),
            settings.replication_epoch,
            self.work_folder(),
            settings.replication_base_every,
            self.publisher.writer_id,
            settings.replication_poll_s,
            settings.replication_gc_after_s or None,
            collection.name,
        )

    # ---- a replica -------------------------------------------------------------------------------

    async def _sync_replica(self) -> None:
        """Mirror the registry: drop the collections it no longer lists (or lists as another incarnation),
        create those it lists, follow them all. Without a registry (a writer of an older release), only
        ``default`` is followed and nothing is dropped."""
        assert self.bucket is not None
        self.listing = listing = await run_in_threadpool(read_listing, self.bucket)
        if listing is not None:
            for collection in self._served():
                listed = listing.get(collection.name)
                if collection.name != DEFAULT_COLLECTION and (
                    listed is None or not same_collection(collection.info, listed)
                ):
                    await self._drop(collection)
            served = {c.name for c in self._served()}
            self.not_followed = {
                name: why for name, why in self.not_followed.items() if name in listing and name not in served
            }
            for name, info in listing.items():
                if name not in served:
                    await self._create(info)
        self._forget_gone()
        for collection in self._served():
            self._worker_for(collection)

    async def _create(self, info: CollectionInfo) -> None:
        """The listed collection, empty, with the writer's identity (its follower copies the base next)."""
        if info.dimension is not None:
            encoder = info.own_vectors()
        else:
            slot = self.engines.models.slots.get(info.model)
            if slot is None or slot.runtime is None:
                why = "is not configured here" if slot is None else slot.error or "is still loading"
                self.not_followed[info.name] = (
                    f"collection {info.name!r}: its model {info.model!r} {why} "
                    f"({self.engines.models.served()}); configure it in CLOZE_MODELS to follow this collection"
                )
                return
            encoder = slot.runtime
        try:
            async with self.lifecycle.created(info, encoder):
                pass
        except ApiError as exc:
            self.not_followed[info.name] = f"collection {info.name!r} cannot be copied here: {exc.message}"
            return
        self.not_followed.pop(info.name, None)
        log.info("collection %r: created from the writer's registry; copying it", info.name)

    async def _drop(self, collection: Collection) -> None:
        try:
            await self.lifecycle.delete(collection.name, lambda _: None)
        except ApiError as exc:  # requests outlived the wait: the next round tries again
            log.warning("collection %r: not dropped yet: %s", collection.name, exc.message)
            return
        log.info("collection %r: dropped (the writer deleted it or made it again)", collection.name)

    def _make_follower(self, collection: Collection, key: str) -> Follower:
        assert self.bucket is not None
        return Follower(
            served_index(collection),
            self.bucket,
            self.bucket.keys(key),
            self.work_folder(),
            self.settings.replication_poll_s,
            collection.name,
        )

    # ---- workers ---------------------------------------------------------------------------------

    def _served(self) -> list[Collection]:
        # list() copies at once: ``status`` runs in a worker thread while the loop may add a collection
        return [c for c in list(self.collections.collections.values()) if not c.closing]

    def _worker_for(self, collection: Collection) -> None:
        """Start the collection's worker when it has none (nothing ships or follows once fenced; a replica
        follows ``default`` and what the registry lists)."""
        replicated = self.workers.get(collection.name)
        if replicated is not None and replicated.collection is collection or self.fenced or not self.bucket:
            return
        listed = (self.listing or {}).get(collection.name)
        if self.role == "replica" and collection.name != DEFAULT_COLLECTION:
            if listed is None or not same_collection(collection.info, listed):
                return  # not listed, or another incarnation whose drop has not happened yet
        if self.role == "writer" or listed is None:
            incarnation = collection.info.incarnation if collection.info else None
        else:
            incarnation = listed.incarnation
        make = self._make_shipper if self.role == "writer" else self._make_follower
        worker = make(collection, collection_key(collection.name, incarnation))
        if replicated is not None:
            stop(replicated.worker)
        self.workers[collection.name] = replicated = Replicated(collection, incarnation, worker)
        replicated.worker.start()

    def _forget_gone(self) -> None:
        """Stop the workers of collections no longer served (made again on a shared volume, say)."""
        served = {id(c) for c in self._served()}
        for name, replicated in list(self.workers.items()):
            if id(replicated.collection) not in served:
                stop(replicated.worker)
                del self.workers[name]

    async def release(self, collection: Collection) -> None:
        """Before a collection closes (a delete): stop its worker and wait for the step it may be in, so
        nothing ships from or applies to an index being closed."""
        replicated = self.workers.get(collection.name)
        if replicated is None or replicated.collection is not collection:
            return
        self.workers.pop(collection.name)
        worker = replicated.worker
        stop(worker)
        if await run_in_threadpool(worker.lock.acquire, True, RELEASE_WAIT_S):
            worker.lock.release()
        else:
            log.warning(
                "collection %r: its %s is still in a step; closing anyway",
                collection.name,
                type(worker).__name__,
            )
        self.wake.set()  # the writer lists the collections again at once

    # ---- what the routes ask ---------------------------------------------------------------------

    def ready(self, states: dict[str, dict[str, Any]]) -> bool:
        """A replica serves once it holds a copy of ``default`` (stale or not); before, it would answer
        from nothing. Other collections report their own state (``states``: ``status()``)."""
        if self.role != "replica":
            return True
        return states.get(DEFAULT_COLLECTION, {}).get("applied_seq") is not None

    def status(self) -> dict[str, dict[str, Any]]:
        """Each replicated collection's state, by name; on a replica also the listed ones it cannot copy."""
        if self.role == "off":
            return {}
        states: dict[str, dict[str, Any]] = {}
        for collection in self._served():
            replicated = self.workers.get(collection.name)
            index = collection.index
            if replicated is None or replicated.collection is not collection or index is None:
                states[collection.name] = {"role": self.role, "waiting": self._waiting(collection)}
                if self.role == "writer":
                    states[collection.name]["fenced"] = self.fenced
            elif isinstance(replicated.worker, Follower):
                states[collection.name] = replicated.worker.status(
                    index, self.settings.replication_stale_after_s
                ) | {"incarnation": replicated.incarnation}
            else:
                state = replicated.worker.status(index)
                states[collection.name] = state | {
                    "fenced": state["fenced"] or self.fenced,
                    "incarnation": replicated.incarnation,
                }
        for name, why in list(self.not_followed.items()):
            states.setdefault(name, {"role": self.role, "followed": False, "error": why})
        return states

    def _waiting(self, collection: Collection) -> str:
        if self.fenced:
            return f"not shipped: {self.fenced}"
        if collection.index is None:
            return "the index is opening"
        return self.registry_error or "replication is starting"

    def summary(self) -> dict[str, Any] | None:
        """What ``/readyz`` says of replication as a whole: the role, the registry, the fence."""
        if self.role == "off":
            return None
        listed = None if self.role == "writer" or self.listing is None else sorted(self.listing)
        return {
            "role": self.role,
            "registry_error": self.registry_error,
            "fenced": self.fenced,
            "listed": listed,
        }

    def admit(self, collection: str, ack: Ack | None) -> Ack:
        """Before a write: the ack mode it gets; 503 when this writer was fenced."""
        mode: Ack = ack or self.settings.replication_ack
        if self.role != "writer":
            if ack == "remote":
                raise ApiError(
                    422, "ack: remote needs a replicated collection (CLOZE_REPLICATION_ROLE=writer)", "ack"
                )
            return "local"
        replicated = self.workers.get(collection)
        fenced = self.fenced or (
            replicated.worker.fenced if replicated and isinstance(replicated.worker, Shipper) else None
        )
        if fenced:
            raise ApiError(503, f"this writer no longer ships the collection: {fenced}")
        return mode

    async def acknowledge(self, mode: Ack, collection: Collection, index: Any) -> None:
        """After a commit: in remote mode, until the bucket holds it and the registry lists its collection
        (503 when that does not happen in time)."""
        if self.role != "writer":
            return
        position = await run_in_threadpool(index.position)
        replicated = self.workers.get(collection.name)
        if mode == "local":
            if replicated is not None:
                replicated.worker.kick()
            else:
                self.wake.set()
            return
        timeout = self.settings.replication_ack_timeout_s
        deadline = time.monotonic() + timeout
        replicated = await self._listed_worker(collection, deadline)
        shipper = replicated.worker if replicated is not None else None
        left = deadline - time.monotonic()
        if (
            not isinstance(shipper, Shipper)
            or left <= 0
            or not await run_in_threadpool(shipper.wait_shipped, position, left)
        ):
            why = self.fenced or (shipper and (shipper.fenced or shipper.error)) or self.registry_error
            raise ApiError(
                503,
                f"committed on the writer but not yet durable in the bucket ({why or f'not shipped within {timeout:g} s'}); "
                "it ships when the bucket answers, and repeating the write is safe",
                headers={"Retry-After": "5"},
            )

    async def _listed_worker(self, collection: Collection, deadline: float) -> Replicated | None:
        """The collection's shipper once the registry names the collection (at once for ``default``, which
        every replica follows); None at the deadline."""
        incarnation = collection.info.incarnation if collection.info else None
        while time.monotonic() < deadline and not self.fenced:
            replicated = self.workers.get(collection.name)
            listed = collection.name == DEFAULT_COLLECTION or (
                self.publisher is not None and self.publisher.listed(collection.name, incarnation)
            )
            if replicated is not None and replicated.collection is collection and listed:
                return replicated
            self.wake.set()
            await asyncio.sleep(0.05)
        return None
