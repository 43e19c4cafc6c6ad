"""What both roles share: a worker thread per replicated collection, started and stopped as the collections
served change, one watchdog over them, the loop that keeps the bucket's registry in step every
``CLOZE_REPLICATION_POLL_S``, and what the routes ask (``/readyz``, writes' ``admit`` and ``acknowledge``), as
a service that replicates nothing answers it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from starlette.concurrency import run_in_threadpool

from app.service.collections import Collection
from app.service.errors import ApiError
from app.service.lifecycle import Lifecycle
from app.settings import Settings
from index.replication.bucket import Bucket, BucketUnavailable, Fenced, collection_key
from index.replication.worker import Worker

log = logging.getLogger("cloze.replication")
Ack = Literal["local", "remote"]
WATCH_EVERY_S = 1.0
RELEASE_WAIT_S = 30.0  # how long a collection's delete waits for its worker's step in progress

W = TypeVar("W", bound=Worker)


@dataclass
class Replicated(Generic[W]):
    """One collection's worker and the bucket folder it ships or follows."""

    collection: Collection
    incarnation: str | None  # the writer's (None: ``default``, or a collection made before incarnations)
    worker: W


def served_index(collection: Collection) -> Callable[[], Any]:
    """What a worker reads its index from: None once a delete withdrew the collection."""
    return lambda: None if collection.closing else collection.index


class Replication(Generic[W]):
    """A role (``replication_for`` picks it) keeps the registry in step (``_sync``), makes a collection's worker
    (``_make_worker``) and says what it reports; the loops, the watchdog and the workers' life are here."""

    role: str  # as /readyz reports it

    def __init__(self, settings: Settings, engines: Any, lifecycle: Lifecycle):
        self.settings, self.engines, self.lifecycle = settings, engines, lifecycle
        self.bucket: Bucket | None = None
        self.workers: dict[str, Replicated[W]] = {}  # by collection name
        self.fenced: str | None = None  # another writer holds this writer's prefix: nothing ships
        self.registry_error: str | None = None
        self.wake = asyncio.Event()
        lifecycle.before_close = self.release

    @property
    def collections(self) -> Any:
        return self.engines.collections

    def work_folder(self) -> Path:
        """Temporary archives, beside the index folder (never inside it: rebuilds and GC own that)."""
        root = Path(self.settings.index).resolve()
        return root.parent / f"{root.name}.replication"

    # ---- what a role decides ---------------------------------------------------------------------

    async def _connected(self, bucket: Bucket) -> None:
        """Once the bucket is open, before the first round."""

    async def _sync(self) -> None:
        """One round: the registry and the workers in step with the collections served."""
        raise NotImplementedError

    def _make_worker(self, collection: Collection, key: str) -> W:
        raise NotImplementedError

    def _replicates(self, collection: Collection) -> bool:
        """Whether the collection gets a worker now."""
        return True

    def _incarnation(self, collection: Collection) -> str | None:
        """The incarnation whose bucket folder the collection's worker ships or follows."""
        return collection.info.incarnation

    def _worker_state(self, worker: W, index: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _waiting_state(self, collection: Collection) -> dict[str, Any]:
        return {"role": self.role, "waiting": self._waiting(collection)}

    def _listed(self) -> list[str] | None:
        """The collections the registry lists, as ``/readyz`` names them (None: not reported)."""
        return None

    # ---- the loops ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Once the collections are open: keep a worker per replicated collection and the registry in step
        (every ``CLOZE_REPLICATION_POLL_S``), and restart any worker that falls silent."""
        while not self.lifecycle.started:
            await asyncio.sleep(0.2)
        settings = self.settings
        self.bucket = await run_in_threadpool(
            Bucket,
            settings.replication_bucket or "",
            settings.replication_endpoint,
            settings.replication_region,
        )
        await self._connected(self.bucket)
        try:
            await asyncio.gather(self._keep_in_step(), self._watch())
        finally:
            for replicated in self.workers.values():
                replicated.worker.stop()

    async def _keep_in_step(self) -> None:
        while True:
            try:
                await self._sync()
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

    def _fence(self, why: str) -> None:
        if self.fenced is None:
            log.error("replication stopped for every collection: %s", why)
        self.fenced = why
        for replicated in self.workers.values():
            replicated.worker.stop()

    # ---- workers ---------------------------------------------------------------------------------

    def _served(self) -> list[Collection]:
        # list() copies at once: ``status`` runs in a worker thread while the loop may add a collection
        return [c for c in list(self.collections.collections.values()) if not c.closing]

    def _worker_for(self, collection: Collection) -> None:
        """Start the collection's worker when it has none (nothing ships or follows once fenced)."""
        replicated = self.workers.get(collection.name)
        if replicated is not None and replicated.collection is collection or self.fenced or not self.bucket:
            return
        if not self._replicates(collection):
            return
        incarnation = self._incarnation(collection)
        worker = self._make_worker(collection, collection_key(collection.name, incarnation))
        if replicated is not None:
            replicated.worker.stop()
        self.workers[collection.name] = replicated = Replicated(collection, incarnation, worker)
        replicated.worker.start()

    def _forget_gone(self) -> None:
        """Stop the workers of collections no longer served (made again on a shared volume, say)."""
        served = {id(c) for c in self._served()}
        for name, replicated in list(self.workers.items()):
            if id(replicated.collection) not in served:
                replicated.worker.stop()
                del self.workers[name]

    async def release(self, collection: Collection) -> None:
        """Before a collection closes (a delete): stop its worker and wait for the step it may be in, so
        nothing ships from or applies to an index being closed."""
        replicated = self.workers.get(collection.name)
        if replicated is None or replicated.collection is not collection:
            return
        self.workers.pop(collection.name)
        worker = replicated.worker
        worker.stop()
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
        """Whether replication lets the service serve (``states``: ``status()``)."""
        return True

    def status(self) -> dict[str, dict[str, Any]]:
        """Each replicated collection's state, by name."""
        states: dict[str, dict[str, Any]] = {}
        for collection in self._served():
            replicated = self.workers.get(collection.name)
            index = collection.index
            if replicated is None or replicated.collection is not collection or index is None:
                states[collection.name] = self._waiting_state(collection)
            else:
                state = self._worker_state(replicated.worker, index)
                states[collection.name] = state | {"incarnation": replicated.incarnation}
        return states

    def _waiting(self, collection: Collection) -> str:
        if self.fenced:
            return f"not shipped: {self.fenced}"
        if collection.index is None:
            return "the index is opening"
        return self.registry_error or "replication is starting"

    def summary(self) -> dict[str, Any] | None:
        """What ``/readyz`` says of replication as a whole: the role, the registry, the fence."""
        return {
            "role": self.role,
            "registry_error": self.registry_error,
            "fenced": self.fenced,
            "listed": self._listed(),
        }

    def admit(self, collection: str, ack: Ack | None) -> Ack:
        """Before a write: the ack mode it gets. Only a writer ships, so only a writer acknowledges remotely."""
        if ack == "remote":
            raise ApiError(
                422, "ack: remote needs a replicated collection (CLOZE_REPLICATION_ROLE=writer)", "ack"
            )
        return "local"

    def refuse_unless_writing(self, collection: str) -> None:
        """Before any write: nothing to refuse unless this service ships (a replica's routes refuse writes
        themselves: ``Collection.writable_index``)."""

    async def acknowledge(self, mode: Ack, collection: Collection, index: Any) -> None:
        """After a commit: nothing to wait for unless this service ships it."""


class Unreplicated(Replication[Worker]):
    """``CLOZE_REPLICATION_ROLE=off``: nothing to ship or follow, nothing to report."""

    role = "off"

    async def run(self) -> None:
        return

    def status(self) -> dict[str, dict[str, Any]]:
        return {}

    def summary(self) -> dict[str, Any] | None:
        return None
