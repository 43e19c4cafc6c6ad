"""The writer (``CLOZE_REPLICATION_ROLE=writer``): a shipper for every collection served, the registry listing
them (``index.replication.registry``), the folders of those it stopped listing deleted once due
(``index.replication.garbage.Sweeper``); a write in remote mode is answered once the bucket holds it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from app.service.collections import Collection
from app.service.errors import ApiError
from app.service.lifecycle import Lifecycle
from app.service.replication.base import Ack, Replicated, Replication, served_index
from app.settings import Settings
from index.replication.bucket import Bucket, Fenced
from index.replication.garbage import Sweeper
from index.replication.registry import Publisher, entry_of
from index.replication.shipper import Shipper, writer_identity


async def shipped(shipper: Shipper, position: tuple[int, int], timeout: float) -> bool:
    """Whether ``position`` is durable in the bucket within ``timeout``. The wait is a future on the event loop
    that the shipper's thread resolves: a waiting write holds no thread of the pool that /readyz and storage
    reads share (120 waiting writes held every one of its 40 and /readyz took 7-10 s)."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[bool] = loop.create_future()

    def settle(ok: bool) -> None:  # in the shipper's thread
        with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody waits any more
            loop.call_soon_threadsafe(lambda: outcome.done() or outcome.set_result(ok))

    withdraw = shipper.on_shipped(position, settle)
    try:
        return await asyncio.wait_for(outcome, timeout)
    except TimeoutError:
        return False
    finally:
        withdraw()


class Writer(Replication[Shipper]):
    role = "writer"

    def __init__(self, settings: Settings, engines: Any, lifecycle: Lifecycle):
        super().__init__(settings, engines, lifecycle)
        self.publisher: Publisher | None = None  # the registry
        self.sweeper: Sweeper | None = None  # the deletion of unlisted collections' folders
        self.registry_read = (
            False  # collections.json was read (and fenced nothing) since this process started
        )
        self.checked = False  # ... and so was each collection's CURRENT.json: until then, no write is taken

    async def _connected(self, bucket: Bucket) -> None:
        settings = self.settings
        writer_id = await run_in_threadpool(writer_identity, Path(settings.index))
        self.publisher = Publisher(bucket, settings.replication_epoch, writer_id)
        if settings.replication_gc_after_s:
            self.sweeper = Sweeper(self.publisher, settings.replication_gc_after_s)

    async def _sync(self) -> None:
        """A shipper for every collection served; then the registry lists them (bases may follow: a replica
        waits for the first), and the folders of those it stopped listing go once due."""
        if self.fenced:
            return
        for replicated in self.workers.values():
            if replicated.worker.fenced:
                raise Fenced(replicated.worker.fenced)
        assert self.publisher is not None
        await run_in_threadpool(self.publisher.check)  # fenced before shipping anything
        self._forget_gone()
        served = self._served()
        for collection in served:
            self._worker_for(collection)
        self.registry_read = True
        # A collection withdrawn for a delete stays listed: a refused delete must not drop replicas' copies.
        listing = {c.name: entry_of(c.info) for c in self.collections.existing() if not c.is_default}
        await run_in_threadpool(self.publisher.publish, listing)
        if self.sweeper is not None:
            self.sweeper.when_due()

    def _make_worker(self, collection: Collection, key: str) -> Shipper:
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

    # ---- what the routes ask ---------------------------------------------------------------------

    def _waiting_state(self, collection: Collection) -> dict[str, Any]:
        return super()._waiting_state(collection) | {"fenced": self.fenced}

    def _worker_state(self, worker: Shipper, index: Any) -> dict[str, Any]:
        state = worker.status(index)
        return state | {"fenced": state["fenced"] or self.fenced, "waiting": self._unchecked()}

    def _checked(self) -> bool:
        """Whether this writer has read collections.json and every collection's CURRENT.json since it started:
        before, it cannot know whether a newer epoch replaced it (one started at an old epoch took writes
        for the ~0.1 s before its first check fenced it). Once true, the usual fence checks take over."""
        if not self.checked:
            shippers = [replicated.worker for replicated in list(self.workers.values())]
            self.checked = self.registry_read and all(shipper.read_current for shipper in shippers)
        return self.checked

    def _unchecked(self) -> str | None:
        """Why no write is taken yet (None: they are)."""
        if self.fenced or self._checked():
            return None
        errors = [r.worker.error for r in list(self.workers.values()) if r.worker.error]
        why = self.registry_error or (errors[0] if errors else None)
        return "this writer has not yet read the bucket's collections.json and CURRENT.json" + (
            f" ({why})" if why else ""
        )

    def ready(self, states: dict[str, dict[str, Any]]) -> bool:
        """A writer serves once it takes writes (or knows it never will: fenced)."""
        return self._unchecked() is None

    def admit(self, collection: str, ack: Ack | None) -> Ack:
        """Before a write of documents: the ack mode it gets (503 as ``refuse_unless_writing``)."""
        self.refuse_unless_writing(collection)
        return ack or self.settings.replication_ack

    def refuse_unless_writing(self, collection: str) -> None:
        """Before any write (documents, a rebuild, a restore, a collection made or deleted): 503 when this
        writer was fenced or has not yet read the bucket (it may have been replaced)."""
        replicated = self.workers.get(collection)
        fenced = self.fenced or (replicated.worker.fenced if replicated else None)
        if fenced:
            raise ApiError(503, f"this writer no longer ships the collection: {fenced}")
        if unchecked := self._unchecked():
            raise ApiError(503, f"{unchecked}: retry shortly", headers={"Retry-After": "1"})

    async def acknowledge(self, mode: Ack, collection: Collection, index: Any) -> None:
        """After a commit: in remote mode, until the bucket holds it and the registry lists its collection
        (503 when that does not happen in time)."""
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
        if shipper is None or left <= 0 or not await shipped(shipper, position, left):
            why = self.fenced or (shipper and (shipper.fenced or shipper.error)) or self.registry_error
            raise ApiError(
                503,
                f"committed on the writer but not yet durable in the bucket ({why or f'not shipped within {timeout:g} s'}); "
                "it ships when the bucket answers, and repeating the write is safe",
                headers={"Retry-After": "5"},
            )

    async def _listed_worker(self, collection: Collection, deadline: float) -> Replicated[Shipper] | None:
        """The collection's shipper once the registry names the collection (at once for ``default``, which
        every replica follows); None at the deadline."""
        incarnation = collection.info.incarnation
        while time.monotonic() < deadline and not self.fenced:
            replicated = self.workers.get(collection.name)
            listed = collection.is_default or (
                self.publisher is not None and self.publisher.listed(collection.name, incarnation)
            )
            if replicated is not None and replicated.collection is collection and listed:
                return replicated
            self.wake.set()
            await asyncio.sleep(0.05)
        return None
