"""A shipper and its followers through random interleavings of what goes wrong in production: writes and
deletes, the writer restarted, puts that fail, puts whose answer is lost after the object landed (at once,
or later: a request a proxy held), bases cut at any moment, replicas restarted and fresh replicas. Real
indexes on both sides and moto's in-memory S3, every step driven by hand in the test's thread; the loopback
tier (tests/replication/) runs the same parts as processes."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from moto import mock_aws

from index.records import Document
from index.replication.bucket import Bucket, BucketUnavailable, ConditionFailed, Keys
from index.replication.follower import Follower
from index.replication.shipper import Shipper
from index.replication.worker import Stuck
from index.search_index import SearchIndex
from tests.conftest import TINY_WORDS
from tests.index.test_replication import everything

EXAMPLES = 12  # histories
STEPS = 30  # events in each
IDS = [f"d{i}" for i in range(6)]  # few ids: writes overwrite and delete each other's documents
REPLICAS = 2
FATES = ["ok", "ok", "failed", "lost", "late"]  # of each put the writer makes
CONVERGE_ROUNDS = 12


class FaultyBucket(Bucket):
    """The writer's side of the bucket: each put meets the next fate in ``fates`` (then "ok"). "failed": raises,
    nothing lands. "lost": lands, then raises (the answer was lost). "late": raises now and lands when the test
    says (a request held on the way), where the store judges its condition then, as S3 would."""

    def __init__(self, url: str, client: Any):
        super().__init__(url, client=client)
        self.fates: list[str] = []
        self.held: list[Callable[[], None]] = []

    def put_bytes(self, key: str, data: bytes, **conditions: Any) -> str:
        fate = self.fates.pop(0) if self.fates else "ok"
        if fate == "failed":
            raise BucketUnavailable(f"{key}: the request never arrived")
        if fate == "late":
            self.held.append(lambda: self._land(key, data, conditions))
            raise BucketUnavailable(f"{key}: no answer (the request is still on its way)")
        etag = super().put_bytes(key, data, **conditions)
        if fate == "lost":
            raise BucketUnavailable(f"{key}: the answer was lost")
        return etag

    def upload_file(self, key: str, path: Path, progress: Any = None) -> None:
        self.put_bytes(key, path.read_bytes())  # a base as one put, meeting its fate as the others

    def _land(self, key: str, data: bytes, conditions: dict[str, Any]) -> None:
        try:
            Bucket.put_bytes(self, key, data, **conditions)
        except ConditionFailed:  # refused on arrival
            pass


EVENTS = (  # repeated: drawn as often
    ["write"] * 6
    + ["ship", "ship"]
    + ["follow"] * 3
    + ["land"] * 3
    + ["cut_base", "cut_base"]
    + ["restart_writer", "restart_replica", "fresh_replica", "converge"]
)
event = st.tuples(
    st.sampled_from(EVENTS),
    st.lists(st.sampled_from(FATES), max_size=3),  # of the puts it makes, in order
    st.integers(0, REPLICAS - 1),  # which replica, which held put
    st.integers(0, 99),  # what a write writes
)


class History:
    """A writer's index and shipper, replicas' indexes and followers, a bucket folder of their own."""

    def __init__(self, root: Path, encoder: Any, client: Any):
        self.root, self.encoder = root, encoder
        url = f"s3://replicas/{root.name}"
        self.faulty, self.bucket = FaultyBucket(url, client), Bucket(url, client=client)
        self.writer = SearchIndex.open(root / "writer", encoder)
        self.shipper = self._shipper()
        self.made = 0
        self.replicas = [self._fresh() for _ in range(REPLICAS)]

    def run(self, kind: str, fates: list[str], which: int, seed: int) -> None:
        self.faulty.fates = list(fates)
        try:
            getattr(self, kind)(which, seed)
        except BucketUnavailable:
            pass  # a fault drawn for it: the worker's loop logs it and steps again
        except Stuck:
            pass  # reported; convergence says whether it got unstuck

    def close(self) -> None:
        for index, follower in self.replicas:
            follower.stop()
            index.close()
        self.writer.close()

    def _shipper(self) -> Shipper:
        keys = self.faulty.keys("default")
        return Shipper(lambda: self.writer, self.faulty, keys, 1, self.root / "w.work", 1000, "writer")

    def _fresh(self) -> tuple[SearchIndex, Follower]:
        self.made += 1
        index = SearchIndex.open(self.root / f"replica{self.made}", self.encoder)
        return index, self._follower(index)

    def _follower(self, index: SearchIndex) -> Follower:
        return Follower(lambda: index, self.bucket, self.bucket.keys("default"), self.root / "r.work")

    # ---- the writer --------------------------------------------------------------------------------

    def write(self, which: int, seed: int) -> None:
        """An upsert of one or two of the few ids, or a delete of one (of what exists), then a shipper step
        (a write kicks it)."""
        rng = random.Random(seed)
        ids = rng.sample(IDS, 1 + seed % 2)
        if seed % 5 == 0 and ids[0] in everything(self.writer):
            self.writer.delete(ids[0])
        else:
            self.writer.upsert([Document(i, " ".join(rng.choices(TINY_WORDS, k=6)), {}) for i in ids])
        self.ship(which, seed)

    def ship(self, which: int, seed: int) -> None:
        """A step of its own: a retry, a heartbeat."""
        self.shipper.step(self.shipper._generation)

    def cut_base(self, which: int, seed: int) -> None:
        """What ``base_every``, a pruned changelog or a start on a new version make the shipper do."""
        self.shipper._ship_base(self.writer, continue_tail=seed % 2 == 0)

    def land(self, which: int, seed: int) -> None:
        if self.faulty.held:
            self.faulty.held.pop(which % len(self.faulty.held))()

    def restart_writer(self, which: int, seed: int) -> None:
        self.shipper = self._shipper()

    # ---- replicas ----------------------------------------------------------------------------------

    def follow(self, which: int, seed: int = 0) -> None:
        index, follower = self.replicas[which]
        before = follower.caught_up_at
        follower.step(follower._generation)
        if follower.caught_up_at != before:  # it says the bucket holds nothing newer: check that
            position = follower.position(index)
            tail = self.bucket.list_after(
                self.bucket.keys("default").tail(position.epoch, position.version), ""
            )
            newest = max((Keys.segment_range(key)[1] for key in tail), default=0)
            assert position.seq >= newest, (
                "a replica said it was caught up with a newer segment in the bucket"
            )

    def restart_replica(self, which: int, seed: int) -> None:
        """On its own folder: it resumes from its position."""
        index, follower = self.replicas[which]
        follower.stop()
        self.replicas[which] = (index, self._follower(index))

    def fresh_replica(self, which: int, seed: int) -> None:
        """On a new folder: it copies the base."""
        index, follower = self.replicas[which]
        follower.stop()
        index.close()
        self.replicas[which] = self._fresh()

    # ---- the property ------------------------------------------------------------------------------

    def converge(self, which: int = 0, seed: int = 0) -> None:
        """Every held put lands and the faults heal: each replica then reaches the writer's position within
        a few rounds and holds exactly its documents."""
        while self.faulty.held:
            self.faulty.held.pop(0)()
        self.faulty.fates = []
        for _ in range(CONVERGE_ROUNDS):
            self.shipper.step(self.shipper._generation)
            for which in range(REPLICAS):
                try:
                    self.follow(which)
                except Stuck as exc:
                    raise AssertionError(f"a replica stays stuck: {exc}") from exc
            if all(self._at_writer(*replica) for replica in self.replicas):
                break
        wanted = everything(self.writer)
        for index, follower in self.replicas:
            assert self._at_writer(index, follower), "a replica stays behind the writer"
            assert everything(index) == wanted, "a replica's documents differ from the writer's"

    def _at_writer(self, index: SearchIndex, follower: Follower) -> bool:
        position = follower.position(index)
        return position is not None and (position.version, position.seq) == self.writer.position()


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="replicas")
        yield client


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same histories every run
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each try replays real indexes (minutes in all)
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(events=st.lists(event, min_size=STEPS, max_size=STEPS))
def test_replicas_equal_the_writer_whatever_the_order_of_faults(
    events: list[tuple[str, list[str], int, int]], tmp_path: Path, tiny_encoder, s3, monkeypatch
) -> None:
    """12 histories of 30 events each (hypothesis, derandomized: the same histories every run), each event
    one of: a write (upserts or a delete among 6 ids) and the shipper step it kicks, a shipper step of its
    own, a base cut (each put in these failing, landing with its answer lost, or held to land later), a held
    put landing, a writer restart, a follower step, a replica restarted on its folder or replaced by a fresh
    one (two replicas), and "converge". Checked: after every follower step that says it is caught up, that
    no segment of its version in the bucket ends past its position; at each "converge" and at the end of
    each history, once every held put has landed and the shipper and both followers have stepped (at most
    12 rounds), that each replica stands at the writer's position, holds exactly the writer's documents
    and is not stuck. So no order of restarts, lost answers and bases leaves a replica behind for good."""
    note("the failing history, event by event:\n" + "\n".join(map(repr, events)))
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # crash durability is not what this checks: time is
    root = Path(tempfile.mkdtemp(dir=tmp_path))  # a folder and a bucket prefix per history
    history = History(root, tiny_encoder, s3)
    try:
        for kind, fates, which, seed in events:
            history.run(kind, fates, which, seed)
        history.converge()
    finally:
        history.close()
