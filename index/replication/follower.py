"""The replica's side: copy the base ``CURRENT.json`` names (a verified restore, ``SearchIndex.restore``),
then apply the tail's segments in order (any that starts at or before its position and ends past it: a
segment holds final document states), each with the replica's position in one transaction (a reader
never sees part of a segment). The position is the writer's (epoch, version, sequence), kept in the local
store, so a replica killed at any point resumes where its last whole segment left it."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any

from index.archive.restore import read_info
from index.collections import DEFAULT_COLLECTION
from index.replication import segments
from index.replication.bucket import SEQ_DIGITS, Bucket, Keys
from index.replication.current import check_base, check_current
from index.replication.freshness import WriterBeats
from index.replication.worker import Stuck, Worker
from index.search_index import import_rules
from index.storage.changelog import ChangeBatch, merge_batches

log = logging.getLogger(__name__)
POSITION = "replica_position"  # the local store's state key
PREFETCH = 8  # segments downloaded at once while earlier ones apply
MERGE_DOCUMENTS = 5000  # documents applied in one transaction at most (a catch-up merges segments)


@dataclass(frozen=True)
class Position:
    epoch: int
    version: int
    seq: int


class Follower(Worker):
    def __init__(
        self,
        index: Callable[[], Any],
        bucket: Bucket,
        keys: Keys,
        work: Path,
        interval: float = 0.5,
        collection: str = DEFAULT_COLLECTION,
    ):
        super().__init__(interval, collection)
        self.index, self.bucket, self.keys, self.work = index, bucket, keys, Path(work)
        self.caught_up_at: float | None = None  # when the bucket last held nothing newer than this copy
        self.writer = WriterBeats()  # the writer's heartbeats as read
        self.waiting: str | None = "no copy of the writer's index yet"
        self.look_from: int | None = None  # where the tail's listing starts (``_pending``); None: all of it
        self.fetch = ThreadPoolExecutor(PREFETCH, thread_name_prefix="segment-fetch")

    def stop(self) -> None:
        """For good: its download threads too (they would idle forever)."""
        super().stop()
        self.fetch.shutdown(wait=False)

    def position(self, index: Any) -> Position | None:
        raw = index.state(POSITION)
        return Position(**json.loads(raw)) if raw else None

    def step(self, generation: int) -> None:
        index = self.index()
        if index is None:
            return
        asked = time.monotonic()
        current, _ = self.bucket.get_json(self.keys.current)
        if current is None:
            self.waiting = "the bucket holds no base of this collection yet (is the writer running?)"
            return
        check_current(current, self.keys)  # a damaged one is refused: this copy keeps serving, stale in time
        # before the tail: a step that fails still learns how far the writer is
        epoch = int(current["epoch"])
        self.writer.saw(epoch, self.bucket.get_json(self.keys.heartbeat(epoch))[0])
        with self.lock:
            if not self.live(generation):
                return
            position = self.position(index)
            if position is None or (position.epoch, position.version) != (
                current["epoch"],
                current["version"],
            ):
                self._bootstrap(index, current)
                return  # the tail next step: a bootstrap can take long, the listing would be stale
            if self._follow_tail(index, position, current, generation):
                self.caught_up_at = asked

    def _follow_tail(self, index: Any, position: Position, current: dict[str, Any], generation: int) -> bool:
        """Apply every segment that continues from ``position``; True when the bucket had nothing newer left."""
        keys = self._pending(position)
        if keys and self._starts_past(keys[0], position) and self.look_from is not None:
            self.look_from = None  # before calling it a gap: a segment that started earlier may cover it
            keys = self._pending(position)
        if not keys or self._starts_past(keys[0], position):
            return self._no_continuation(index, position, current, keys)
        # Downloads run ahead of the applying, and consecutive segments apply as one transaction: a replica
        # back from a crash had hundreds of small segments, each a commit and a FAISS catch-up.
        run: list[ChangeBatch] = []
        seq = position.seq
        rules = import_rules(index.encoder, index.limits)
        for key, (data, _) in zip(keys, self.fetch.map(self.bucket.get_bytes, keys), strict=True):
            after, through = Keys.segment_range(key)
            if through <= seq:  # inside what an overlapping segment already applied: its states are older
                continue
            if after > seq or data is None:  # a gap (the next step sees it first), or deleted meanwhile
                break
            run.append(segments.decode(data, int(index.encoder.dimension), rules)[1])
            seq = through
            if sum(len(batch.upserts) for batch in run) >= MERGE_DOCUMENTS:
                break
        if run and self.live(generation):
            position = Position(position.epoch, position.version, seq)
            index.apply_batch(merge_batches(run), {POSITION: json.dumps(asdict(position))})
            self.alive()
        return False  # more may have landed while these applied: list again before saying caught up

    @staticmethod
    def _starts_past(key: str, position: Position) -> bool:
        return Keys.segment_range(key)[0] > position.seq

    def _no_continuation(
        self, index: Any, position: Position, current: dict[str, Any], keys: list[str]
    ) -> bool:
        """No segment continues from ``position``: caught up when none is newer either. Otherwise a gap: the
        newest base closes it when it is past the position (a fresh replica copies the same); one that is
        not leaves the replica serving what it holds, saying why, until the writer ships a newer base."""
        base_seq = int(current["base_seq"])
        if not keys and base_seq <= position.seq:
            return True
        gap = f"the tail does not continue from sequence {position.seq}"
        if keys:
            gap += f" (its next segment is {keys[0].rsplit('/', 1)[1]})"
        if base_seq > position.seq:
            log.warning("%s: copying the newest base (sequence %s)", gap, base_seq)
            self._bootstrap(index, current)
            return False
        self.caught_up_at = None  # behind the writer for as long as this lasts
        raise Stuck(
            f"{gap}, and the newest base (sequence {base_seq}) is not past it: serving sequence "
            f"{position.seq} until the writer ships a newer base"
        )

    def _pending(self, position: Position) -> list[str]:
        """The tail's segments that end past ``position``, in order (a batch of downloads at most). A segment
        holds each document's final state at its end, so one that starts at or before the position and ends
        past it applies as well as one that starts there (a re-shipped put, a writer that resumed behind a
        base). Listed from where the last segment seen at or before the position starts, not from the
        position: the writer never resumes behind its last segment, so nothing that still matters starts
        earlier; after a copy of a base or a start, from the whole tail once."""
        prefix = self.keys.tail(position.epoch, position.version)
        start = "" if self.look_from is None else f"{prefix}{self.look_from:0{SEQ_DIGITS}d}"
        listed = [(key, *Keys.segment_range(key)) for key in self.bucket.list_after(prefix, start)]
        starts = [after for _, after, _ in listed if after <= position.seq]
        if starts:
            self.look_from = max(starts)
        return [key for key, _, through in listed if through > position.seq][: PREFETCH * 4]

    def _bootstrap(self, index: Any, current: dict[str, Any]) -> None:
        """The base as a new local version (verified, published and swapped as any restore), then its
        position; killed in between, the next start finds no position for it and copies it again."""
        self.look_from = None  # a segment of this base's tail may have started before it
        started = time.monotonic()
        self.work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.work, prefix=".base-") as folder:
            archive = Path(folder) / "base.tar"
            try:
                self.bucket.download_file(current["base"], archive, progress=self.alive)
            except KeyError:  # a newer base was current long enough for the writer to delete this one
                log.info("base %s is gone from the bucket: reading CURRENT.json again", current["base"])
                return
            self.alive()
            check_base(current, read_info(archive))
            downloaded = time.monotonic()
            index.restore(archive, private=True)  # our own download: checksummed once, as it is extracted
        seq = int(current["base_seq"])
        position = Position(int(current["epoch"]), int(current["version"]), seq)
        index.apply_batch(ChangeBatch(seq, seq), {POSITION: json.dumps(asdict(position))})
        self.waiting = None
        log.info(
            "copied base %s in %.1f s (download %.1f s, verified restore %.1f s)",
            current["base"],
            time.monotonic() - started,
            downloaded - started,
            time.monotonic() - downloaded,
        )

    def status(self, index: Any, stale_after: float) -> dict[str, Any]:
        position = self.position(index)
        caught_up = None if self.caught_up_at is None else round(time.monotonic() - self.caught_up_at, 3)
        return {
            "role": "replica",
            "epoch": position.epoch if position else None,
            "version": position.version if position else None,
            "applied_seq": position.seq if position else None,
            **self.writer.report(None if position is None else astuple(position), stale_after, self.stuck),
            "caught_up_s": caught_up,  # since a poll found nothing newer: the failover runbook's check
            "waiting": None if position else self.waiting,
            "error": self.error,
            "watchdog_restarts": self.restarts,
        }
