"""Which collections a writer ships: one small object beside theirs, ``<prefix>/collections.json``.

    {"format": 1, "epoch": 2, "writer": "<id>", "written": <time>,
     "collections": {"<name>": {<CollectionInfo as collection.json holds it: model or dimension and metric,
                                 factory, chunking, created, incarnation>}}}

``default`` is not listed: every replica follows it. A replica creates each listed collection locally from its
entry (the same incarnation, so the same bucket key, ``collection_key``), drops what the writer no longer lists,
and follows the rest. The writer replaces the object with a conditional put, as ``CURRENT.json``; its epoch
fences the whole prefix: a writer that finds a higher epoch here (or another writer at its own) ships nothing.
The writer also deletes the folders of collections it has stopped listing (``garbage.Sweeper``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from index.collections import DEFAULT_COLLECTION, CollectionInfo
from index.replication.bucket import Bucket, ConditionFailed, Fenced, collection_key

REGISTRY_FORMAT = 1
REGISTRY_FILE = "collections.json"
INFO_FIELDS = tuple(item.name for item in dataclasses.fields(CollectionInfo))


def registry_key(bucket: Bucket) -> str:
    return f"{bucket.prefix}/{REGISTRY_FILE}" if bucket.prefix else REGISTRY_FILE


def entry_of(info: CollectionInfo) -> dict[str, Any]:
    """What a replica needs to make the collection as the writer made it."""
    return dataclasses.asdict(info)


def info_of(entry: dict[str, Any]) -> CollectionInfo:
    """The entry as a collection to create; fields a later format adds are left out, not refused."""
    return CollectionInfo(**{name: entry[name] for name in INFO_FIELDS if name in entry})


def listed_folders(collections: dict[str, dict[str, Any]]) -> set[str]:
    """The folders a registry's ``collections`` (name -> entry) names, and ``default``'s, never listed there."""
    named = {collection_key(name, entry.get("incarnation")) for name, entry in collections.items()}
    return named | {DEFAULT_COLLECTION}


def read_listing(bucket: Bucket) -> dict[str, CollectionInfo] | None:
    """The collections the writer lists, by name; None when the bucket holds no registry (yet)."""
    body, _ = bucket.get_json(registry_key(bucket))
    if body is None:
        return None
    if body.get("format") != REGISTRY_FORMAT:
        raise ValueError(
            f"{REGISTRY_FILE}: format {body.get('format')!r}, this version reads {REGISTRY_FORMAT}"
        )
    return {name: info_of(entry) for name, entry in body["collections"].items()}


class Publisher:
    """The writer's side: the registry as it last read or wrote it, replaced when the collections change."""

    def __init__(self, bucket: Bucket, epoch: int, writer_id: str):
        self.bucket, self.key, self.epoch, self.writer_id = bucket, registry_key(bucket), epoch, writer_id
        self.body: dict[str, Any] | None = None  # the object as last read or written
        self.etag: str | None = None
        self.lock = threading.Lock()  # one read or put at a time
        # every folder this process has listed: only those may it delete once unlisted, so a promoted writer
        # never deletes a collection it did not hold (the old writer's registry is not its own)
        self.published: set[str] = set()

    def check(self) -> None:
        """Read the object when its ETag moved (or never read): ``Fenced`` if another writer holds it."""
        with self.lock:
            self._check()

    def _check(self) -> None:
        if self.etag is None or self.bucket.etag(self.key) != self.etag:
            self.body, self.etag = self.bucket.get_json(self.key)
        self._refuse_other_writers()

    def _refuse_other_writers(self) -> None:
        if self.body is None:
            return
        if self.body["epoch"] > self.epoch:
            raise Fenced(
                f"the bucket's {REGISTRY_FILE} is at epoch {self.body['epoch']}, this writer's is {self.epoch}: "
                "another writer was promoted (docs/deployment.md, failover)"
            )
        if self.body["epoch"] == self.epoch and self.body.get("writer") != self.writer_id:
            raise Fenced(
                f"another writer ({self.body.get('writer')}) ships epoch {self.epoch}: give each promotion a "
                "new epoch (docs/deployment.md, failover)"
            )

    def publish(self, collections: dict[str, dict[str, Any]]) -> None:
        """Make the registry list ``collections`` (name -> ``entry_of``), at this writer's epoch. A put that
        loses a race reads the object again (``Fenced`` if a newer writer wrote it) and tries once more."""
        for _ in range(2):
            with self.lock:
                self._check()
                if self.lists(collections):
                    self.published |= listed_folders(collections)
                    return
                body = {
                    "format": REGISTRY_FORMAT,
                    "epoch": self.epoch,
                    "writer": self.writer_id,
                    "written": time.time(),
                    "collections": collections,
                }
                try:
                    if self.etag is None:
                        etag = self.bucket.put_json(self.key, body, if_absent=True)
                    else:
                        etag = self.bucket.put_json(self.key, body, if_match=self.etag)
                except ConditionFailed:
                    self.etag = None  # read again
                    continue
                self.body, self.etag = body, etag
                self.published |= listed_folders(collections)
                return
        raise ConditionFailed(f"{self.key} changed twice while this writer replaced it")

    def lists(self, collections: dict[str, dict[str, Any]]) -> bool:
        """Whether the bucket's registry, as last seen, is this writer's and lists exactly ``collections``."""
        body = self.body
        return (
            body is not None
            and (body["epoch"], body.get("writer")) == (self.epoch, self.writer_id)
            and body["collections"] == collections
        )

    def listed(self, name: str, incarnation: str | None) -> bool:
        """Whether this writer's registry in the bucket names that collection (a replica would follow it)."""
        body = self.body
        if body is None or (body["epoch"], body.get("writer")) != (self.epoch, self.writer_id):
            return False
        entry = body["collections"].get(name)
        return entry is not None and entry.get("incarnation") == incarnation

    def folders(self) -> set[str] | None:
        """The folders this writer's registry lists (``default``'s too), read again if it moved; None until
        this writer has published it. ``Fenced`` if another writer holds it."""
        with self.lock:
            self._check()
            body = self.body
            if body is None or (body["epoch"], body.get("writer")) != (self.epoch, self.writer_id):
                return None
            return listed_folders(body["collections"])
