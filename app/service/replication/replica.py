"""A replica (``CLOZE_REPLICATION_ROLE=replica``): it mirrors the writer's registry (creates what it lists,
drops what it no longer does, or lists as another incarnation) and follows ``default`` and every listed
collection; it serves once it holds a copy of ``default``."""

from __future__ import annotations

import logging
from typing import Any

from starlette.concurrency import run_in_threadpool

from app.service.collections import Collection
from app.service.errors import ApiError
from app.service.lifecycle import Lifecycle
from app.service.replication.base import Replication, served_index
from app.settings import Settings
from index.collections import DEFAULT_COLLECTION, CollectionInfo
from index.replication.follower import Follower
from index.replication.registry import read_listing

log = logging.getLogger("cloze.replication")


def same_collection(local: CollectionInfo | None, listed: CollectionInfo) -> bool:
    """Whether a local copy is the incarnation the writer lists (one listed without an incarnation, made
    before they were recorded, is known by its name alone)."""
    return local is not None and listed.incarnation in (None, local.incarnation)


class Replica(Replication[Follower]):
    role = "replica"

    def __init__(self, settings: Settings, engines: Any, lifecycle: Lifecycle):
        super().__init__(settings, engines, lifecycle)
        self.listing: dict[str, CollectionInfo] | None = None  # the registry as last read
        self.not_followed: dict[str, str] = {}  # listed collections this replica cannot copy, and why

    async def _sync(self) -> None:
        """Mirror the registry: drop the collections it no longer lists (or lists as another incarnation),
        create those it lists, follow them all. Without a registry (a writer of an older release), only
        ``default`` is followed and nothing is dropped."""
        assert self.bucket is not None
        self.listing = listing = await run_in_threadpool(read_listing, self.bucket)
        if listing is not None:
            await self._mirror(listing)
        self._forget_gone()
        for collection in self._served():
            self._worker_for(collection)

    async def _mirror(self, listing: dict[str, CollectionInfo]) -> None:
        for collection in self._served():
            listed = listing.get(collection.name)
            if not collection.is_default and (listed is None or not same_collection(collection.info, listed)):
                await self._drop(collection)
        served = {c.name for c in self._served()}
        self.not_followed = {
            name: why for name, why in self.not_followed.items() if name in listing and name not in served
        }
        for name, info in listing.items():
            if name not in served:
                await self._create(info)

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

    # ---- its workers -------------------------------------------------------------------------------

    def _listed_as(self, collection: Collection) -> CollectionInfo | None:
        return (self.listing or {}).get(collection.name)

    def _replicates(self, collection: Collection) -> bool:
        """``default``, and what the registry lists as this incarnation (another one's drop may be pending)."""
        listed = self._listed_as(collection)
        return collection.is_default or (listed is not None and same_collection(collection.info, listed))

    def _incarnation(self, collection: Collection) -> str | None:
        listed = self._listed_as(collection)
        return super()._incarnation(collection) if listed is None else listed.incarnation

    def _make_worker(self, collection: Collection, key: str) -> Follower:
        assert self.bucket is not None
        return Follower(
            served_index(collection),
            self.bucket,
            self.bucket.keys(key),
            self.work_folder(),
            self.settings.replication_poll_s,
            collection.name,
        )

    # ---- what the routes ask ---------------------------------------------------------------------

    def ready(self, states: dict[str, dict[str, Any]]) -> bool:
        """A replica serves once it holds a copy of ``default`` (stale or not); before, it would answer
        from nothing. Other collections report their own state (``states``: ``status()``)."""
        return states.get(DEFAULT_COLLECTION, {}).get("applied_seq") is not None

    def status(self) -> dict[str, dict[str, Any]]:
        """Each followed collection's state, and the listed ones it cannot copy."""
        states = super().status()
        for name, why in list(self.not_followed.items()):
            states.setdefault(name, {"role": self.role, "followed": False, "error": why})
        return states

    def _worker_state(self, worker: Follower, index: Any) -> dict[str, Any]:
        return worker.status(index, self.settings.replication_stale_after_s)

    def _listed(self) -> list[str] | None:
        return None if self.listing is None else sorted(self.listing)
