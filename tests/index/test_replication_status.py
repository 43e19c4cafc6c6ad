"""What a replica says about itself, against moto's in-memory S3, each step driven by hand: the writer's
position comes from its heartbeat, read every poll whatever the tail does, and no lag is computed from an
old one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from index.replication.follower import Follower
from tests.index.test_replication import bucket, docs, pair, shipper, step  # noqa: F401  (fixtures)

STALE_AFTER_S = 10


def test_a_failing_step_still_reads_the_heartbeat(tmp_path: Path, bucket, pair, monkeypatch) -> None:  # noqa: F811
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work")
    writer.upsert(docs(4, 1, "a"))
    step(ship)
    step(follower)  # the base
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
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, keys, tmp_path / "r.work")
    writer.upsert(docs(4, 1, "a"))
    step(ship)
    step(follower)
    step(follower)
    fresh = follower.status(replica, STALE_AFTER_S)
    assert fresh["lag"] == 0 and fresh["writer_heartbeat_age_s"] < STALE_AFTER_S

    beat, _ = bucket.get_json(keys.heartbeat(1))  # the writer died a minute ago: its last heartbeat stays
    bucket.put_json(keys.heartbeat(1), beat | {"time": time.time() - 60})
    step(follower)
    status = follower.status(replica, STALE_AFTER_S)
    assert status["lag"] is None and status["stale"]
    assert status["writer_heartbeat_age_s"] >= 60 and status["writer_seq"] == beat["seq"]
