"""``CURRENT.json`` is checked, not trusted (moto's in-memory S3, each step driven by hand): a replica refuses
one that disagrees with the base key it names or with that base's own ``snapshot.json``, and the writer
replaces any it did not write with a new base."""

from __future__ import annotations

from pathlib import Path

import pytest

from index.replication.current import BadCurrent
from index.replication.follower import Follower
from index.replication.shipper import Shipper
from tests.index.test_replication import bucket, docs, everything, pair, shipper, started, step  # noqa: F401  (fixtures)


def test_a_flipped_digit_is_refused_by_replicas_and_replaced_by_the_writer(
    tmp_path: Path,
    bucket,  # noqa: F811
    pair,  # noqa: F811
) -> None:
    writer, replica = pair
    keys = bucket.keys("default")
    ship, follower = started(pair, bucket, tmp_path)
    copied = follower.position(replica)

    current, _ = bucket.get_json(keys.current)
    bucket.put_json(keys.current, current | {"version": current["version"] + 1})  # still valid JSON
    writer.upsert(docs(2, 2, "b"))
    step(ship)  # a segment: the fence check after it sees CURRENT.json changed
    with pytest.raises(BadCurrent, match="damaged"):
        step(follower)
    assert follower.position(replica) == copied  # nothing copied as another version

    step(ship)  # a base replaces what this writer did not write
    repaired, _ = bucket.get_json(keys.current)
    assert repaired["version"] == writer.position()[0] and repaired["base_seq"] == writer.position()[1]
    step(follower)
    step(follower)
    assert everything(replica) == everything(writer)
    assert follower.position(replica).version == writer.position()[0]


def test_an_idle_writer_notices_a_damaged_current_with_its_next_heartbeat(
    tmp_path: Path,
    bucket,  # noqa: F811
    pair,  # noqa: F811
) -> None:
    writer, _ = pair
    keys = bucket.keys("default")
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    writer.upsert(docs(4, 1, "a"))
    step(ship)
    good, _ = bucket.get_json(keys.current)
    bucket.put_json(keys.current, good | {"epoch": 7})  # a false fence: its base key still says e1
    ship.heartbeat_at = 0
    step(ship)  # nothing to ship; the heartbeat's fence check reads it
    assert ship.fenced is None
    step(ship)
    assert bucket.get_json(keys.current)[0]["epoch"] == 1


def test_a_base_whose_own_snapshot_disagrees_is_not_copied(
    tmp_path: Path,
    bucket,  # noqa: F811
    pair,  # noqa: F811
) -> None:
    writer, replica = pair
    keys = bucket.keys("default")
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    writer.upsert(docs(4, 1, "a"))
    step(ship)
    current, _ = bucket.get_json(keys.current)
    bucket.put_json(keys.current, current | {"documents": 40})  # the key agrees; the base does not
    follower = Follower(lambda: replica, bucket, keys, tmp_path / "r.work")
    with pytest.raises(BadCurrent, match="documents 40 where the base says 4"):
        step(follower)
    assert follower.position(replica) is None and everything(replica) == {}


def test_a_shipper_reads_current_json_before_its_index_is_open(tmp_path: Path, bucket) -> None:  # noqa: F811
    """The writer takes no write before every shipper has read its CURRENT.json: one whose collection is still
    opening (or failed to) must not hold the others back."""
    ship = Shipper(lambda: None, bucket, bucket.keys("default"), 1, tmp_path / "w", 1000, "writer")
    step(ship)
    assert ship.read_current and ship.current is None
