"""The writer's side: ship the collection to the bucket. A base (a snapshot archive, ``index.archive.snapshots``)
whenever the live version changes (a rebuild, a restore) or the tail since the last base grew long, then
``CURRENT.json`` naming it, written last and conditionally; between bases, the changelog as immutable
segments (``segments``), each holding the changed documents with their vectors. A heartbeat tells replicas
how far the writer is. Remote-mode writes register here (``on_shipped``) to hear when their sequence is in
the bucket."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from index.collections import DEFAULT_COLLECTION
from index.replication import segments
from index.replication.bucket import Bucket, ConditionFailed, Fenced, Keys
from index.replication.current import CURRENT_FORMAT, BadCurrent, check_current
from index.replication.garbage import Pruner
from index.replication.worker import Worker
from index.storage.changelog import ChangelogPruned
from index.storage.vectors import atomic_write

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
MOST_DOCUMENTS_PER_SEGMENT = 5000  # more changed documents than this: a new base is cheaper to copy


def writer_identity(root: Path) -> str:
    """This writer's name in the bucket, kept in its index folder (it moves with the volume): the same
    across its restarts (it resumes its own tail), another for any other writer (refused at the same epoch)."""
    path = Path(root) / ".replication-writer"
    if not path.exists():
        Path(root).mkdir(parents=True, exist_ok=True)
        atomic_write(path, uuid.uuid4().hex.encode())
    return path.read_text().strip()


@dataclass(eq=False)  # compared by identity: two writes may wait for the same position
class Waiter:
    position: tuple[int, int]
    done: Callable[[bool], None]


class Shipper(Worker):
    def __init__(
        self,
        index: Callable[[], Any],
        bucket: Bucket,
        keys: Keys,
        epoch: int,
        work: Path,
        base_every: int,
        writer_id: str,
        interval: float = 0.5,
        gc_after_s: float | None = None,
        collection: str = DEFAULT_COLLECTION,
    ):
        super().__init__(interval, collection)
        self.index, self.bucket, self.keys, self.epoch = index, bucket, keys, epoch
        self.work, self.base_every = Path(work), base_every
        self.writer_id = writer_id
        self.current: dict[str, Any] | None = None  # CURRENT.json as this writer last wrote it
        self.etag: str | None = None
        self.read_current = False
        self.shipped: tuple[int, int] | None = None  # (version, sequence) durable in the bucket
        # Where this version's next segment starts: the last segment's end, kept across a base cut past it so
        # caught-up replicas continue without copying the base (an overlap applies, a gap does not)
        self.tail: int | None = None
        self.fenced: str | None = None
        self.heartbeat_at = 0.0
        self.waiters: list[Waiter] = []  # remote-mode writes waiting for their position to ship
        self.waiters_lock = threading.Lock()
        self.pruner: Pruner | None = None  # deletes what no replica can need (None: nothing is ever deleted)
        if gc_after_s is not None:
            self.pruner = Pruner(bucket, keys, epoch, gc_after_s, lambda: self.fenced)

    # ---- one step --------------------------------------------------------------------------------

    def step(self, generation: int) -> None:
        if self.fenced:
            return
        index = self.index()
        with self.lock:
            if not self.live(generation):
                return
            try:
                beat = self._ship_and_check(index)
            except Fenced as exc:
                self.fenced = str(exc)
                log.error("replication stopped: %s", exc)
                self._settle_waiters()
                return
        if index is None:
            return
        if beat:
            self._heartbeat(index)
        if self.pruner is not None and self.current is not None:
            self.pruner.when_due()  # in a thread of its own

    def _ship_and_check(self, index: Any) -> bool:
        """Ship what is new; whether a heartbeat is due (the fence check goes with it)."""
        if not self.read_current:  # first, index or not: the writer takes no write before (``Writer.admit``)
            self._read_current()
        if index is None:
            return False
        self._ship(index)
        if not self._heartbeat_due():
            return False
        self._check_fence()  # an idle writer too notices, within a second, a CURRENT.json it did not write
        return True

    def _ship(self, index: Any) -> None:
        version, _ = index.position()
        if self.current is None or self.current["version"] != version:
            self._ship_base(index, continue_tail=False)
            return
        if self.tail is None:
            self._resume_tail(index)
        try:
            number, batch = self._changes(index)
        except (ChangelogPruned, OverflowError) as exc:
            log.info("shipping a new base: %s", exc)
            self._ship_base(index, continue_tail=False)
            return
        if number != version or batch.through == batch.after:
            return  # a rebuild swapped versions meanwhile (its base goes next step), or nothing new
        key = self.keys.segment(self.epoch, number, batch.after, batch.through)
        try:
            self.bucket.put_bytes(key, segments.encode(batch, number), if_absent=True)
        except ConditionFailed:  # this writer shipped it before a restart: segments are immutable
            log.info("segment %s was already in the bucket", key)
        except Exception:
            # The put may have landed with its answer lost: the next segment continues from what the
            # bucket lists, not a longer overlapping one under another key.
            self.tail = None
            raise
        self.tail = batch.through  # landed: a fence check that fails next must not make it ship again
        self._check_fence()
        self._mark_shipped(number, batch.through)
        if self.current is None:  # CURRENT.json was not as this writer left it: a base replaces it next step
            return
        if batch.through - int(self.current["base_seq"]) >= self.base_every:
            self._ship_base(index, continue_tail=True)

    def _changes(self, index: Any) -> tuple[int, Any]:
        """The documents changed after the tail's end; after the base's sequence when the changelog no longer
        reaches back to the tail's end (replicas still there then copy the base)."""
        assert self.tail is not None and self.current is not None
        try:
            return index.changes_after(self.tail, MOST_DOCUMENTS_PER_SEGMENT)
        except ChangelogPruned:
            if self.tail >= int(self.current["base_seq"]):
                raise
            self.tail = int(self.current["base_seq"])
            return index.changes_after(self.tail, MOST_DOCUMENTS_PER_SEGMENT)

    # ---- CURRENT.json and the fence --------------------------------------------------------------

    def _read_current(self) -> None:
        current, etag = self.bucket.get_json(self.keys.current)
        self.read_current = True
        self.etag = etag
        if current is None or self._damaged(current):
            return  # the next step ships a base (over the damaged one: the ETag is kept)
        self._refuse_newer(current)
        if current["epoch"] == self.epoch:
            self._refuse_twin(current)
            self.current = current

    def _refuse_newer(self, current: dict[str, Any]) -> None:
        if current["epoch"] > self.epoch:
            raise Fenced(
                f"the bucket's CURRENT.json is at epoch {current['epoch']}, this writer's is {self.epoch}: "
                "another writer was promoted (docs/deployment.md, failover)"
            )

    def _check_fence(self) -> None:
        """After a segment lands, and with each heartbeat: ``CURRENT.json`` still as this writer left it, or
        a newer epoch fenced it; anything else (damaged, deleted, put back by an older writer) is replaced by
        a new base next step, so replicas never follow a CURRENT.json this writer did not write."""
        etag = self.bucket.etag(self.keys.current)
        if etag == self.etag:
            return
        current, self.etag = self.bucket.get_json(self.keys.current)
        if current == self.current:
            return  # the same object written again
        if current is not None and not self._damaged(current):
            self._refuse_newer(current)
            if current["epoch"] == self.epoch:
                self._refuse_twin(current)
        log.warning("%s is not the one this writer wrote: shipping a base to replace it", self.keys.current)
        self.current = None

    def _damaged(self, current: dict[str, Any]) -> bool:
        """Whether ``CURRENT.json`` disagrees with itself (its epoch, then, fences nothing)."""
        try:
            check_current(current, self.keys)
        except BadCurrent as exc:
            log.warning("%s: this writer replaces it with a new base", exc)
            return True
        return False

    def _refuse_twin(self, current: dict[str, Any]) -> None:
        if current.get("writer") != self.writer_id:
            raise Fenced(
                f"another writer ({current.get('writer')}) ships epoch {self.epoch}: give each promotion a "
                "new epoch (docs/deployment.md, failover)"
            )

    def _resume_tail(self, index: Any) -> None:
        """After a restart or a failed put: the tail continues from the last segment in the bucket (a segment
        that starts there and ends past a newer base serves replicas at either), from the base when there is
        none; what is durable is the newer of the two."""
        assert self.current is not None
        version = int(self.current["version"])
        keys = self.bucket.list_after(self.keys.tail(self.epoch, version), "")
        last_segment = Keys.segment_range(keys[-1])[1] if keys else 0
        shipped = max(last_segment, int(self.current["base_seq"]))
        _, local = index.position()
        if shipped > local:
            raise Fenced(
                f"the bucket holds sequence {shipped} of version {version} at epoch {self.epoch}, this "
                f"writer's index only {local}: is another writer using epoch {self.epoch}?"
            )
        self.tail = last_segment if keys else shipped
        self._mark_shipped(version, shipped)

    def _ship_base(self, index: Any, continue_tail: bool = False) -> None:
        """A base of the live version and CURRENT.json pointing at it. ``continue_tail``: the same version's
        tail goes on from its last segment (a base cut by ``base_every``); otherwise it starts at the base."""
        self.work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.work, prefix=".base-") as folder:
            entry = index.snapshot(Path(folder))
            version, seq = int(entry["version"]), int(entry["sequence"])
            key = self.keys.base(self.epoch, version, seq)
            started = time.monotonic()
            self.bucket.upload_file(key, Path(folder) / entry["name"], progress=self.alive)
        current = {
            "format": CURRENT_FORMAT,
            "epoch": self.epoch,
            "version": version,
            "base": key,
            "base_seq": seq,
            "documents": entry.get("documents"),
            "model_fingerprint": entry.get("model_fingerprint"),
            "writer": self.writer_id,
            "written": time.time(),
        }
        try:
            if self.etag is None:
                etag = self.bucket.put_json(self.keys.current, current, if_absent=True)
            else:
                etag = self.bucket.put_json(self.keys.current, current, if_match=self.etag)
        except ConditionFailed:
            self.read_current, self.current = False, None  # read it again next step: fenced, or retry
            latest, _ = self.bucket.get_json(self.keys.current)
            if latest is not None and not self._damaged(latest):
                self._refuse_newer(latest)
            return
        self.current, self.etag = current, etag
        log.info(
            "base of version %s at sequence %s shipped in %.1f s", version, seq, time.monotonic() - started
        )
        if not continue_tail or self.tail is None:
            self.tail = seq
        self._mark_shipped(version, seq)

    # ---- acknowledgements ------------------------------------------------------------------------

    def _mark_shipped(self, version: int, seq: int) -> None:
        self.shipped = (version, seq)
        self._settle_waiters()

    def on_shipped(self, position: tuple[int, int], done: Callable[[bool], None]) -> Callable[[], None]:
        """Call ``done(True)`` once ``position`` (version, sequence) is durable in the bucket, ``done(False)``
        once this writer is fenced: at once if so already, else from the shipper's thread. Nothing blocks, so
        a waiting write holds no thread. Returns what withdraws the wait (a timeout)."""
        waiter = Waiter(position, done)
        with self.waiters_lock:
            outcome = self._outcome(position)
            if outcome is None:
                self.waiters.append(waiter)
        if outcome is not None:
            done(outcome)
        self.kick()
        return lambda: self._withdraw(waiter)

    def _outcome(self, position: tuple[int, int]) -> bool | None:
        if self.fenced:
            return False
        return True if self.shipped is not None and self.shipped >= position else None

    def _settle_waiters(self) -> None:
        with self.waiters_lock:
            settled = [(waiter, self._outcome(waiter.position)) for waiter in self.waiters]
            self.waiters = [waiter for waiter, outcome in settled if outcome is None]
        for waiter, outcome in settled:
            if outcome is not None:
                waiter.done(outcome)

    def _withdraw(self, waiter: Waiter) -> None:
        with self.waiters_lock:
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    # ---- telling replicas ------------------------------------------------------------------------

    def _heartbeat_due(self) -> bool:
        since = time.monotonic() - self.heartbeat_at
        return since >= 2 * HEARTBEAT_S or (
            since >= HEARTBEAT_S and not self.kicked
        )  # a waiting write goes first

    def _heartbeat(self, index: Any) -> None:
        version, seq = index.position()
        self.bucket.put_json(
            self.keys.heartbeat(self.epoch),
            {
                "writer": self.writer_id,
                "version": version,
                "seq": seq,
                "shipped": self.shipped,
                "time": time.time(),
            },
        )
        self.heartbeat_at = time.monotonic()

    def status(self, index: Any) -> dict[str, Any]:
        version, seq = index.position()
        shipped = self.shipped[1] if self.shipped and self.shipped[0] == version else None
        return {
            "role": "writer",
            "epoch": self.epoch,
            "version": version,
            "seq": seq,
            "shipped_seq": shipped,
            "unshipped": None if shipped is None else seq - shipped,
            "fenced": self.fenced,
            "error": self.error,
        }
