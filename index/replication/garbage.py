"""Which of a collection's objects no replica can need any more (the writer deletes them).

Everything is placed in the collection's history by (epoch, version, sequence); ``CURRENT.json`` only moves
forward in it (a new base of the same version, a rebuild's or restore's new version, a promoted writer's new
epoch). A base is *settled* once it is at or before the base ``CURRENT.json`` names and has been in the bucket
for the grace period: by then a replica still copying an older base, or following an older tail, has had that
long to finish. What lies behind the newest settled base is garbage: older bases, segments that end at or
before it, and older epochs' heartbeats. Nothing at or after it goes, so neither does anything
``CURRENT.json`` names. A replica that still wanted a deleted object finds the tail cut (or its base gone)
and copies the current base.

A collection the writer no longer lists (deleted, or deleted and made again: a new incarnation, a new folder)
has no shipper left to do that: the writer deletes its whole folder once the registry has not listed it for the
grace period and nothing was written in it for as long (``unlisted_since``, ``abandoned``). Replicas drop an
unlisted collection within a poll, so by then none reads it.

Only the writer deletes: each shipper's ``Pruner`` its collection's old objects, the service's one ``Sweeper``
the unlisted folders. Each runs at most every ``GC_EVERY_S`` in a thread of its own (``Periodic``): a listing
of a whole folder must hold up neither a remote-mode write nor the event loop.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from index.replication.bucket import Bucket, BucketUnavailable, Fenced, Keys
from index.replication.registry import Publisher

log = logging.getLogger(__name__)

GC_EVERY_S = 60.0  # how often the writer looks for objects no replica can need

CURRENT = re.compile(r"CURRENT\.json")
BASE = re.compile(r"e(\d+)/v(\d+)/base-(\d+)\.tar")
SEGMENT = re.compile(r"e(\d+)/v(\d+)/tail/(\d+)-(\d+)\.json\.gz")
HEARTBEAT = re.compile(r"e(\d+)/heartbeat\.json")


class Place(NamedTuple):
    epoch: int
    version: int
    seq: int


def named(current: dict[str, Any]) -> Place:
    return Place(int(current["epoch"]), int(current["version"]), int(current["base_seq"]))


def settled_base(
    listing: list[tuple[str, float]], root: str, current: dict[str, Any], grace_s: float, now: float
) -> Place | None:
    """The newest base at or before ``CURRENT.json``'s that has been in the bucket ``grace_s`` seconds."""
    bases = [
        (Place(*map(int, found.groups())), written)
        for key, written in listing
        if (found := BASE.fullmatch(_relative(key, root)))
    ]
    ripe = [place for place, written in bases if place <= named(current) and now - written >= grace_s]
    return max(ripe, default=None)


def obsolete(
    listing: list[tuple[str, float]], root: str, current: dict[str, Any], grace_s: float, now: float
) -> list[str]:
    """The keys of ``listing`` (key, when written) behind the settled base; ``root`` is the collection's
    folder (``Keys.root``), ``now`` on the bucket's clock (the store's ``LastModified``)."""
    settled = settled_base(listing, root, current, grace_s, now)
    if settled is None:
        return []
    return [key for key, _ in listing if _behind(_relative(key, root), settled)]


def unlisted_since(
    folders: Iterable[str], listed: set[str], seen: dict[str, float], now: float
) -> dict[str, float]:
    """Since when each of ``folders`` has been unlisted, as this writer saw it (``seen``: the last answer, empty
    after a restart, so a restarted writer waits the grace period again); one listed again is forgotten."""
    return {folder: seen.get(folder, now) for folder in folders if folder not in listed}


def abandoned(listing: list[tuple[str, float]], root: str, grace_s: float, now: float) -> list[str]:
    """An unlisted folder's objects (``listing``: key, when written; ``root``: the folder) once the newest of
    them is ``grace_s`` old; only those of replication's layout, so another tool's objects there stay."""
    if not listing or now - max(written for _, written in listing) < grace_s:
        return []
    return [key for key, _ in listing if _ours(_relative(key, root))]


def _ours(name: str) -> bool:
    return any(pattern.fullmatch(name) for pattern in (CURRENT, BASE, SEGMENT, HEARTBEAT))


def _behind(name: str, settled: Place) -> bool:
    if found := BASE.fullmatch(name):
        return Place(*map(int, found.groups())) < settled
    if found := SEGMENT.fullmatch(name):
        epoch, version, _, through = map(int, found.groups())
        return Place(epoch, version, through) <= settled
    if found := HEARTBEAT.fullmatch(name):
        return int(found.group(1)) < settled.epoch
    return False  # CURRENT.json, and anything this version does not write


def _relative(key: str, root: str) -> str:
    return key[len(root) + 1 :] if key.startswith(root + "/") else key


# ---- the writer's deletions ----------------------------------------------------------------------------


class Periodic:
    """A call made in a thread of its own, at most once every ``every_s`` and never two at once: slow bucket
    listings off the thread (or event loop) that asks for it."""

    def __init__(self, call: Callable[[], Any], every_s: float, name: str):
        self.call, self.every_s, self.name = call, every_s, name
        self.due = 0.0
        self.thread: threading.Thread | None = None

    def when_due(self) -> None:
        if time.monotonic() < self.due or (self.thread is not None and self.thread.is_alive()):
            return
        self.due = time.monotonic() + self.every_s
        self.thread = threading.Thread(target=self.call, name=self.name, daemon=True)
        self.thread.start()


def delete_decided(bucket: Bucket, decide: Callable[[], list[str]], what: str) -> list[str]:
    """Delete the keys ``decide`` names (it reads the bucket to choose them) and return them; a bucket that
    does not answer deletes nothing (logged), and the next round tries again."""
    try:
        doomed = decide()
        bucket.delete(doomed)
    except BucketUnavailable as exc:
        log.warning("replication: deleting %s: the bucket is unavailable: %s", what, exc)
        return []
    if doomed:
        log.info("replication: deleted %s objects, %s", len(doomed), what)
    return doomed


class Pruner:
    """A shipper's deletions: what lies behind its collection's newest settled base (``obsolete``), judged
    against ``CURRENT.json`` as the bucket holds it now, so a writer whose epoch lost it deletes nothing."""

    def __init__(self, bucket: Bucket, keys: Keys, epoch: int, grace_s: float, fenced: Callable[[], Any]):
        self.bucket, self.keys, self.epoch, self.grace_s = bucket, keys, epoch, grace_s
        self.fenced = fenced  # truthy once the shipper was fenced
        self.periodic = Periodic(self.prune, min(GC_EVERY_S, grace_s), "replication-gc")

    def when_due(self) -> None:
        self.periodic.when_due()

    def prune(self) -> list[str]:
        return delete_decided(self.bucket, self._obsolete, "what no replica needs any more")

    def _obsolete(self) -> list[str]:
        current, _ = self.bucket.get_json(self.keys.current)
        if current is None or current["epoch"] != self.epoch or self.fenced():
            return []
        listing = self.bucket.list_with_times(self.keys.root + "/")
        return obsolete(listing, self.keys.root, current, self.grace_s, time.time())


class Sweeper:
    """The writer deletes the folders of the collections its registry stopped listing, once unlisted for
    ``grace_s`` (``unlisted_since``, ``abandoned``)."""

    def __init__(self, publisher: Publisher, grace_s: float):
        self.publisher, self.bucket, self.grace_s = publisher, publisher.bucket, grace_s
        self.unlisted: dict[str, float] = {}  # folder -> since when (monotonic) this writer saw it unlisted
        self.periodic = Periodic(self.sweep, min(GC_EVERY_S, grace_s), "replication-sweep")

    def when_due(self) -> None:
        self.periodic.when_due()

    def sweep(self) -> list[str]:
        """Delete what is due; nothing unless this writer's registry is the bucket's."""
        return delete_decided(self.bucket, self._abandoned, "the folders of collections no longer listed")

    def _abandoned(self) -> list[str]:
        try:
            listed = self.publisher.folders()
        except Fenced:
            return []  # the loop that publishes finds it too, and stops the writer
        if listed is None:
            return []
        now = time.monotonic()
        ours = [folder for folder in self.bucket.folders() if folder in self.publisher.published]
        self.unlisted = unlisted_since(ours, listed, self.unlisted, now)
        doomed: list[str] = []
        for folder, since in self.unlisted.items():
            if now - since >= self.grace_s:
                root = self.bucket.keys(folder).root
                listing = self.bucket.list_with_times(root + "/")
                doomed += abandoned(listing, root, self.grace_s, time.time())
        return doomed
