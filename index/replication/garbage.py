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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from index.collections import DEFAULT_COLLECTION
from index.replication.bucket import collection_key

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


def listed_folders(collections: dict[str, dict[str, Any]]) -> set[str]:
    """The folders a registry's ``collections`` (name -> entry) names, and ``default``'s, never listed there."""
    named = {collection_key(name, entry.get("incarnation")) for name, entry in collections.items()}
    return named | {DEFAULT_COLLECTION}


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
