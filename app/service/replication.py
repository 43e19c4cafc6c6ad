"""Replication in the service: the default collection's shipper (``CLOZE_REPLICATION_ROLE=writer``) or
follower (``replica``), started once the index opens, watched by a watchdog, and asked by the routes:
``/readyz`` reports it, writes ask ``admit`` before and ``acknowledge`` after they commit."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Literal

from starlette.concurrency import run_in_threadpool

from app.service.errors import ApiError
from app.settings import Settings
from index.collections import DEFAULT_COLLECTION
from index.replication.bucket import Bucket, collection_key
from index.replication.follower import Follower
from index.replication.shipper import Shipper, writer_identity

log = logging.getLogger("cloze.replication")
Ack = Literal["local", "remote"]
WATCH_EVERY_S = 1.0


class Replication:
    def __init__(self, settings: Settings, engines: Any):
        self.settings, self.engines = settings, engines
        self.role = settings.replication_role
        self.worker: Shipper | Follower | None = None

    @property
    def index(self) -> Any:
        return self.engines.collections.default.index

    def work_folder(self) -> Path:
        """Temporary archives, beside the index folder (never inside it: rebuilds and GC own that)."""
        root = Path(self.settings.index).resolve()
        return root.parent / f"{root.name}.replication"

    def _make_worker(self) -> Shipper | Follower:
        settings = self.settings
        bucket = Bucket(
            settings.replication_bucket or "", settings.replication_endpoint, settings.replication_region
        )
        default = self.engines.collections.default
        # default carries no incarnation (it is never deleted through the API): its key is its name alone
        keys = bucket.keys(
            collection_key(DEFAULT_COLLECTION, default.info.incarnation if default.info else None)
        )
        if self.role == "writer":
            return Shipper(
                lambda: self.index,
                bucket,
                keys,
                settings.replication_epoch,
                self.work_folder(),
                settings.replication_base_every,
                writer_identity(Path(settings.index)),
                settings.replication_poll_s,
                settings.replication_gc_after_s or None,
            )
        return Follower(lambda: self.index, bucket, keys, self.work_folder(), settings.replication_poll_s)

    async def run(self) -> None:
        """Start the worker once the index is open, then restart it whenever it falls silent."""
        if self.role == "off":
            return
        while self.index is None:
            await asyncio.sleep(0.2)
        self.worker = await run_in_threadpool(self._make_worker)
        self.worker.start()
        try:
            while True:
                await asyncio.sleep(WATCH_EVERY_S)
                silent = self.worker.silent_for()
                if silent > self.settings.replication_watchdog_s:
                    self.worker.restart(f"silent for {silent:.0f} s (CLOZE_REPLICATION_WATCHDOG_S)")
        finally:
            self.worker.stop()

    # ---- what the routes ask ---------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """A replica serves once it holds a copy (stale or not); before, it would answer from nothing."""
        if self.role != "replica":
            return True
        return self.worker is not None and self.index is not None and self.status()["applied_seq"] is not None

    def status(self) -> dict[str, Any] | None:
        if self.role == "off":
            return None
        if self.worker is None or self.index is None:
            return {"role": self.role, "waiting": "the index is opening"}
        if isinstance(self.worker, Follower):
            return self.worker.status(self.index, self.settings.replication_stale_after_s)
        return self.worker.status(self.index)

    def admit(self, collection: str, ack: Ack | None) -> Ack:
        """Before a write: the ack mode it gets; 503 when this writer was fenced or its bucket unknown yet."""
        mode: Ack = ack or self.settings.replication_ack
        if self.role != "writer" or collection != DEFAULT_COLLECTION:
            if ack == "remote":
                raise ApiError(
                    422, "ack: remote needs a replicated collection (CLOZE_REPLICATION_ROLE=writer)", "ack"
                )
            return "local"
        if isinstance(self.worker, Shipper) and self.worker.fenced:
            raise ApiError(503, f"this writer no longer ships the collection: {self.worker.fenced}")
        return mode

    async def acknowledge(self, mode: Ack, index: Any) -> None:
        """After a commit: in remote mode, until the bucket holds it (503 when it does not in time)."""
        worker = self.worker
        if not isinstance(worker, Shipper):
            return
        position = await run_in_threadpool(index.position)
        if mode == "local":
            worker.kick()
            return
        timeout = self.settings.replication_ack_timeout_s
        if not await run_in_threadpool(worker.wait_shipped, position, timeout):
            why = worker.fenced or worker.error or f"not shipped within {timeout:g} s"
            raise ApiError(
                503,
                f"committed on the writer but not yet durable in the bucket ({why}); it ships when the bucket "
                "answers, and repeating the write is safe",
                headers={"Retry-After": "5"},
            )
