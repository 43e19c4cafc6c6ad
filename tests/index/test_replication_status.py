"""What a replica says about itself, against moto's in-memory S3, each step driven by hand: the writer's
position comes from its heartbeat, read every poll whatever the tail does; no lag is computed from an old
one; `stale` means behind what the writer published by more than the bound, whatever each poll found."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from index.replication.freshness import WriterBeats
from tests.index.test_replication import bucket, docs, pair, shipper, started, step  # noqa: F401  (fixtures)

STALE_AFTER_S = 10


def test_a_failing_step_still_reads_the_heartbeat(tmp_path: Path, bucket, pair, monkeypatch) -> None:  # noqa: F811
    writer, replica = pair
    ship, follower = started(pair, bucket, tmp_path)
    assert follower.status(replica, STALE_AFTER_S)["writer_seq"] == writer.position()[1]

    def stuck(*_: object) -> bool:
        raise RuntimeError("the tail does not continue")

    monkeypatch.setattr(follower, "_follow_tail", stuck)
    writer.upsert(docs(3, 2, "b"))
    ship.heartbeat_at = 0  # due now
    step(ship)
    with pytest.raises(RuntimeError):
        step(follower)
    status = follower.status(replica, STALE_AFTER_S)
    assert status["writer_seq"] == writer.position()[1]
    assert status["lag"] == writer.position()[1] - status["applied_seq"] > 0


def test_no_lag_from_a_heartbeat_older_than_the_bound(tmp_path: Path, bucket, pair) -> None:  # noqa: F811
    writer, replica = pair
    keys = bucket.keys("default")
    ship, follower = started(pair, bucket, tmp_path)
    step(follower)
    fresh = follower.status(replica, STALE_AFTER_S)
    assert fresh["lag"] == 0 and fresh["writer_heartbeat_age_s"] < STALE_AFTER_S

    beat, _ = bucket.get_json(keys.heartbeat(1))  # the writer died a minute ago: its last heartbeat stays
    bucket.put_json(keys.heartbeat(1), beat | {"time": time.time() - 60})
    step(follower)
    status = follower.status(replica, STALE_AFTER_S)
    assert status["lag"] is None and status["stale"]
    assert status["writer_heartbeat_age_s"] >= 60 and status["writer_seq"] == beat["seq"]


def test_a_replica_applying_writes_every_poll_is_not_stale(tmp_path: Path, bucket, pair) -> None:  # noqa: F811
    writer, replica = pair
    ship, follower = started(pair, bucket, tmp_path)
    for round_ in range(5):  # every poll finds a new segment: the bucket never holds "nothing newer"
        writer.upsert(docs(2, 10 + round_, f"r{round_}-"))
        ship.heartbeat_at = 0
        step(ship)
        step(follower)
        status = follower.status(replica, STALE_AFTER_S)
        assert status["lag"] == 0 and not status["stale"] and status["staleness_s"] < STALE_AFTER_S, status


def beats_each_second(seconds: int, seq_from: int) -> WriterBeats:
    """A writer heard once a second for ``seconds`` up to now, one write between heartbeats."""
    beats, now = WriterBeats(), time.time()
    for i in range(seconds + 1):
        beats.saw(1, {"version": 3, "seq": seq_from + i, "time": now - seconds + i})
    return beats


def test_stale_is_how_long_ago_the_writer_was_where_the_replica_is() -> None:
    beats = beats_each_second(30, seq_from=100)  # the writer at 100 thirty seconds ago, at 130 now
    one_behind = beats.report((1, 3, 129), STALE_AFTER_S)
    assert one_behind["lag"] == 1 and not one_behind["stale"] and one_behind["staleness_s"] < 2

    stuck = beats.report((1, 3, 110), STALE_AFTER_S)  # the writer left 110 twenty seconds ago
    assert stuck["lag"] == 20 and stuck["stale"] and 19 < stuck["staleness_s"] < 22

    assert beats.report((1, 2, 999), STALE_AFTER_S)["stale"]  # another version: the writer rebuilt
    assert not beats.report((2, 1, 0), STALE_AFTER_S)["stale"]  # a newer epoch holds all of an older one
    unknown = WriterBeats().report((1, 3, 130), STALE_AFTER_S)
    assert unknown["stale"] and unknown["staleness_s"] is None and unknown["lag"] is None
