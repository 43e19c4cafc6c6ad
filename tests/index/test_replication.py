"""Replication's mechanics in one process: a writer's index shipped to a bucket (moto's S3, in memory) and a
replica's index following it, each step driven by hand. The loopback tier (tests/replication/) runs the
same against `cloze serve` processes and a moto server, with kills, a cut network and a paused bucket."""

from __future__ import annotations

import base64
import gzip
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from moto import mock_aws

from index.records import Document
from index.replication import garbage, registry, segments
from index.replication.bucket import Bucket
from index.replication.follower import Follower
from index.replication.shipper import Shipper
from index.search_index import SearchIndex, import_rules
from index.storage.changelog import ChangeBatch, merge_batches, read_changes
from tests.index.conftest import tiny_documents

URL = "s3://replicas/team"


def docs(count: int, seed: int, prefix: str) -> list[Document]:
    return [
        Document(f"{prefix}{i}", r["text"], {"color": r["color"]})
        for i, r in enumerate(tiny_documents(count, seed))
    ]


@pytest.fixture
def bucket():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="replicas")
        yield Bucket(URL, client=client)


@pytest.fixture
def pair(tmp_path: Path, tiny_encoder) -> Iterator[tuple[SearchIndex, SearchIndex]]:
    """A writer's index and a replica's."""
    writer = SearchIndex.open(tmp_path / "w", tiny_encoder)
    replica = SearchIndex.open(tmp_path / "r", tiny_encoder)
    try:
        yield writer, replica
    finally:
        replica.close()
        writer.close()


def shipper(
    index: SearchIndex, bucket: Bucket, epoch: int, name: str, tmp_path: Path, **options: Any
) -> Shipper:
    base_every = options.pop("base_every", 1000)
    return Shipper(
        lambda: index,
        bucket,
        bucket.keys("default"),
        epoch,
        tmp_path / f"{name}.work",
        base_every,
        name,
        **options,
    )


def step(worker: Shipper | Follower) -> None:
    """One round of the worker's loop, here in the test's thread."""
    worker.step(worker._generation)


def started(
    pair: tuple[SearchIndex, SearchIndex], bucket: Bucket, tmp_path: Path
) -> tuple[Shipper, Follower]:
    """A writer whose first four documents went out as its first base, and a replica that copied it."""
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work")
    writer.upsert(docs(4, 1, "a"))
    step(ship)
    step(follower)
    return ship, follower


def everything(index: SearchIndex) -> dict[str, Document | None]:
    page, _ = index.list_documents(limit=1000)
    return {d.id: d for d in page}


def test_a_segment_carries_a_batch_whole(tmp_path: Path, tiny_encoder) -> None:
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        index.upsert(docs(6, 1, "a"))
        index.delete("a2")
        _, batch = index.changes_after(0)
        rules = import_rules(tiny_encoder, index.limits)
        version, decoded = segments.decode(segments.encode(batch, 7), tiny_encoder.dimension, rules)
        assert version == 7 and (decoded.after, decoded.through) == (0, batch.through)
        assert decoded.deletes == ["a2"] and [d.id for d, _, _ in decoded.upserts] == [
            d.id for d, _, _ in batch.upserts
        ]
        for (_, _, sent), (_, _, got) in zip(batch.upserts, decoded.upserts, strict=True):
            assert (sent == got).all()
        with pytest.raises(segments.BadSegment):
            segments.decode(b"not gzip", tiny_encoder.dimension, rules)
    finally:
        index.close()


def deep(levels: int) -> dict:
    node: dict = {}
    for _ in range(levels):
        node = {"k": node}
    return node


@pytest.mark.parametrize(
    "tamper, why",
    [
        (lambda item: item.update(metadata=deep(900)), "nested deeper"),
        (lambda item: item.update(metadata=["a", "list"]), "not a JSON object"),
        (lambda item: item.update(id=" "), "not one an upsert accepts"),
        (lambda item: item.update(text=7), "not text"),
        (lambda item: item.update(vectors=nan_like(item["vectors"])), "NaN"),
        (lambda item: item.update(chunks=[[0, 5]]), "a chunk's text"),
    ],
)
def test_a_segment_is_checked_as_an_upsert_is(tmp_path: Path, tiny_encoder, tamper, why) -> None:
    """Whatever the bucket holds is refused when no upsert would store it (a replica applied a segment's
    metadata 900 levels deep, or NaN vectors, as they came), as a restore's rows are."""
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        index.upsert(docs(2, 1, "a"))
        _, batch = index.changes_after(0)
        body = json.loads(gzip.decompress(segments.encode(batch, 7)))
        tamper(body["upserts"][0])
        hostile = gzip.compress(json.dumps(body).encode())
        with pytest.raises(segments.BadSegment, match=why):
            segments.decode(hostile, tiny_encoder.dimension, import_rules(tiny_encoder, index.limits))
    finally:
        index.close()


def nan_like(vectors: str) -> str:
    """A segment's base64 vectors, every number NaN."""
    return base64.b64encode(
        np.full(len(base64.b64decode(vectors)) // 4, np.nan, np.float32).tobytes()
    ).decode()


def test_a_replica_copies_the_base_then_follows_the_tail(tmp_path: Path, tiny_encoder, bucket, pair) -> None:
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work")
    writer.upsert(docs(8, 1, "a"))
    step(ship)  # the first base
    step(follower)
    assert everything(replica) == everything(writer)

    writer.upsert(docs(4, 2, "b"))
    writer.delete("a1")
    step(ship)  # one segment
    step(follower)
    step(follower)
    assert everything(replica) == everything(writer) and "a1" not in everything(replica)
    status = follower.status(replica, stale_after=10)
    assert status["applied_seq"] == writer.position()[1] and status["lag"] == 0 and not status["stale"]
    hits = replica.search(tiny_encoder.embed(["x"], normalize=True)[0], "", top_k=3)
    assert len(hits) == 3
    assert replica.stats() == writer.stats()

    writer.rebuild()  # a new version: a new base, which the replica restores
    writer.upsert(docs(2, 3, "c"))
    step(ship)
    step(ship)
    step(follower)
    step(follower)
    assert everything(replica) == everything(writer)
    assert follower.position(replica).version == writer.position()[0]


def test_a_writer_of_an_older_epoch_is_fenced(tmp_path: Path, tiny_encoder, bucket) -> None:
    old = SearchIndex.open(tmp_path / "old", tiny_encoder)
    new = SearchIndex.open(tmp_path / "new", tiny_encoder)
    keys = bucket.keys("default")
    zombie, promoted = shipper(old, bucket, 1, "old", tmp_path), shipper(new, bucket, 2, "promoted", tmp_path)
    try:
        old.upsert(docs(3, 1, "a"))
        step(zombie)
        step(promoted)  # takes CURRENT.json over with epoch 2
        current, _ = bucket.get_json(keys.current)
        assert current["epoch"] == 2
        old.upsert(docs(2, 2, "z"))
        step(zombie)  # its segment lands under e1; the fence check stops it
        assert zombie.fenced and "epoch 2" in zombie.fenced
        outcome: list[bool] = []
        zombie.on_shipped(old.position(), outcome.append)  # a remote-mode write's wait: refused at once
        assert outcome == [False]
        assert bucket.get_json(keys.current)[0]["epoch"] == 2
        twin = shipper(new, bucket, 2, "twin", tmp_path)
        step(twin)  # a second writer at the promoted one's epoch: refused at once
        assert twin.fenced and "another writer" in twin.fenced
    finally:
        old.close()
        new.close()


def test_reading_changes_behind_a_pruned_changelog_is_refused(tmp_path: Path, tiny_encoder) -> None:
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        index.upsert(docs(3, 1, "a"))
        index._live.snapshot()  # prunes the changelog behind FAISS
        from index.storage.changelog import ChangelogPruned

        with pytest.raises(ChangelogPruned):
            read_changes(index._live.store, tiny_encoder.dimension, 0)
        assert isinstance(index.changes_after(index.position()[1])[1], ChangeBatch)
    finally:
        index.close()


def test_merged_batches_give_the_last_state_of_each_document(tiny_encoder) -> None:
    def doc(doc_id: str, text: str) -> tuple:
        return (Document(doc_id, text), [], None)

    first = ChangeBatch(0, 5, upserts=[doc("a", "one"), doc("b", "two")])
    second = ChangeBatch(5, 9, upserts=[doc("a", "three"), doc("c", "four")], deletes=["b"])
    third = ChangeBatch(9, 12, deletes=["c"], upserts=[doc("b", "five")])
    merged = merge_batches([first, second, third])
    assert (merged.after, merged.through) == (0, 12)
    assert {d.id: d.text for d, _, _ in merged.upserts} == {"a": "three", "b": "five"}
    assert merged.deletes == ["c"]


def test_garbage_is_what_lies_behind_the_newest_settled_base() -> None:
    root = "p/default"
    written = {  # key -> seconds ago it was written
        "CURRENT.json": 0,
        "e1/heartbeat.json": 0,
        "e1/v1/base-000000000000.tar": 900,
        "e1/v1/tail/000000000000-000000000004.json.gz": 900,
        "e1/v1/base-000000000004.tar": 800,
        "e1/v2/tail/000000000000-000000000003.json.gz": 500,
        "e1/v2/tail/000000000003-000000000007.json.gz": 500,  # straddles the base at 5: still needed
        "e1/v2/base-000000000005.tar": 500,  # a rebuild's version
        "e2/heartbeat.json": 0,
        "e2/v1/base-000000000005.tar": 100,  # the promoted writer's base, the one CURRENT.json names
        "e2/v1/tail/000000000005-000000000006.json.gz": 50,
        "e3/v1/base-000000000009.tar": 500,  # a writer of a newer epoch that never took CURRENT.json
    }
    listing = [(f"{root}/{key}", 1000.0 - ago) for key, ago in written.items()]
    current = {"epoch": 2, "version": 1, "base_seq": 5}

    def obsolete(grace_s: float) -> list[str]:
        return sorted(
            key.removeprefix(root + "/") for key in garbage.obsolete(listing, root, current, grace_s, 1000)
        )

    assert obsolete(2000) == []
    assert obsolete(850) == []  # only e1/v1's first base has settled: nothing lies behind it
    assert obsolete(600) == ["e1/v1/base-000000000000.tar", "e1/v1/tail/000000000000-000000000004.json.gz"]
    assert obsolete(300) == [  # behind e1/v2's base: the segment that straddles it stays
        "e1/v1/base-000000000000.tar",
        "e1/v1/base-000000000004.tar",
        "e1/v1/tail/000000000000-000000000004.json.gz",
        "e1/v2/tail/000000000000-000000000003.json.gz",
    ]
    # the base CURRENT.json names has settled: every older epoch goes; its tail and the newer epoch stay
    assert obsolete(60) == sorted(key for key in written if key.startswith("e1/"))


def test_an_unlisted_folder_goes_once_unlisted_and_untouched_for_the_grace_period() -> None:
    listed = registry.listed_folders({"legal": {"incarnation": "a1"}, "old": {"incarnation": None}})
    assert listed == {"legal@a1", "old", "default"}  # default is never listed, and always kept
    folders = ["default", "legal@a1", "legal@z9", "old", "images@b2"]
    seen = garbage.unlisted_since(folders, listed, {}, now=100)
    assert seen == {"legal@z9": 100, "images@b2": 100}
    seen = garbage.unlisted_since(folders + ["new@c3"], listed | {"images@b2"}, seen, now=150)
    assert seen == {"legal@z9": 100, "new@c3": 150}  # listed again: forgotten; first seen keeps its time

    root = "p/legal@z9"
    written = {"CURRENT.json": 50, "e1/heartbeat.json": 900, "e1/v1/base-000000000003.tar": 40}
    written |= {"e1/v1/tail/000000000003-000000000004.json.gz": 60, "notes.txt": 10, "e1/README": 10}
    listing = [(f"{root}/{key}", 1000.0 - ago) for key, ago in written.items()]
    assert garbage.abandoned(listing, root, grace_s=60, now=1000) == []  # notes.txt was written 10 s ago
    doomed = garbage.abandoned(listing, root, grace_s=10, now=1000)
    assert sorted(key.removeprefix(root + "/") for key in doomed) == [  # another tool's objects stay
        "CURRENT.json",
        "e1/heartbeat.json",
        "e1/v1/base-000000000003.tar",
        "e1/v1/tail/000000000003-000000000004.json.gz",
    ]
    nested = [(f"{root}/default/CURRENT.json", 0.0)]  # a deployment under a longer prefix is not ours
    assert garbage.abandoned(nested, root, grace_s=10, now=1000) == []
    assert garbage.abandoned([], root, grace_s=10, now=1000) == []


def test_the_writer_deletes_old_bases_and_a_replica_behind_them_copies_the_current_one(
    tmp_path: Path, tiny_encoder, bucket, pair
) -> None:
    writer, replica = pair
    keys = bucket.keys("default")
    ship = shipper(writer, bucket, 1, "writer", tmp_path, base_every=4, gc_after_s=3600)
    follower = Follower(lambda: replica, bucket, keys, tmp_path / "r.work")
    writer.upsert(docs(3, 1, "a"))
    step(ship)  # the first base
    step(follower)
    first = bucket.get_json(keys.current)[0]
    for round_ in range(3):  # segments, then a new base past every 4 changes
        writer.upsert(docs(3, 10 + round_, f"b{round_}"))
        step(ship)
    current = bucket.get_json(keys.current)[0]
    assert current["base_seq"] > first["base_seq"]
    before = bucket.list_after(keys.root + "/", "")
    assert ship.pruner is not None
    assert ship.pruner.prune() == []  # nothing has been current for an hour yet

    ship.pruner.grace_s = 0
    doomed = ship.pruner.prune()
    after = bucket.list_after(keys.root + "/", "")
    assert first["base"] in doomed and current["base"] in after and keys.current in after
    assert set(after) == set(before) - set(doomed)
    assert all(keys.segment_range(key)[1] > current["base_seq"] for key in after if "/tail/" in key)

    copied = replica.position()[0]
    follower._bootstrap(replica, first)  # a copy of a base deleted meanwhile: given up, no error
    assert replica.position()[0] == copied
    step(follower)  # behind the current base, its tail gone: copies the current base
    assert replica.position()[0] > copied
    step(follower)
    assert everything(replica) == everything(writer)
    assert follower.position(replica).seq == writer.position()[1]


@pytest.mark.parametrize("restart", [False, True], ids=["steady", "restarted"])
def test_a_base_cut_past_the_last_segment_leaves_caught_up_replicas_on_the_tail(
    tmp_path: Path, tiny_encoder, bucket, pair, restart: bool
) -> None:
    """A base cut past the last segment (writes landed between them: base_every under load), steady or after
    the writer restarted: the next segment starts at the last one's end and ends past the base, so a replica
    caught up on the tail continues without copying the base, and one copied from the base applies it too."""
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work")
    writer.upsert(docs(3, 1, "a"))
    step(ship)  # the first base
    step(follower)
    writer.upsert(docs(2, 2, "b"))
    step(ship)  # a segment
    step(follower)  # caught up on the tail
    writer.upsert(docs(2, 3, "c"))
    ship._ship_base(writer, continue_tail=True)  # past the last segment, as base_every cuts one
    if restart:
        ship = shipper(writer, bucket, 1, "writer", tmp_path)
    writer.upsert(docs(1, 4, "d"))
    step(ship)
    base_seq = bucket.get_json(bucket.keys("default").current)[0]["base_seq"]
    tail = bucket.list_after(bucket.keys("default").tail(1, writer.position()[0]), "")
    after, through = bucket.keys("default").segment_range(tail[-1])
    assert after < base_seq < through  # straddles the base

    copies = []
    bootstrap = follower._bootstrap
    follower._bootstrap = lambda *a: copies.append(a) or bootstrap(*a)
    step(follower)
    assert everything(replica) == everything(writer) and "d0" in everything(replica)
    assert copies == [], "a caught-up replica copied the whole base"

    fresh_index = SearchIndex.open(tmp_path / "fresh", tiny_encoder)
    try:
        fresh = Follower(lambda: fresh_index, bucket, bucket.keys("default"), tmp_path / "f.work")
        step(fresh)  # the base
        step(fresh)  # the segment across it
        assert everything(fresh_index) == everything(writer)
    finally:
        fresh_index.close()


def test_a_segment_whose_put_landed_but_failed_is_not_overlapped(
    tmp_path: Path, tiny_encoder, bucket, pair, monkeypatch
) -> None:
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work")
    writer.upsert(docs(3, 1, "a"))
    step(ship)
    step(follower)
    writer.upsert(docs(2, 2, "b"))
    put = bucket.put_bytes

    def landed_then_timed_out(*args: Any, **kwargs: Any) -> Any:
        put(*args, **kwargs)
        raise TimeoutError("the answer was lost")

    monkeypatch.setattr(bucket, "put_bytes", landed_then_timed_out)
    with pytest.raises(TimeoutError):
        step(ship)
    monkeypatch.setattr(bucket, "put_bytes", put)
    step(follower)  # applies the segment that landed
    writer.upsert(docs(2, 3, "c"))
    step(ship)
    tail = bucket.list_after(bucket.keys("default").tail(1, writer.position()[0]), "")
    ranges = [bucket.keys("default").segment_range(key) for key in tail]
    assert all(after == through for (_, through), (after, _) in zip(ranges, ranges[1:], strict=False))
    step(follower)
    step(follower)
    assert everything(replica) == everything(writer) and "c1" in everything(replica)


def put_segment(bucket: Bucket, writer: SearchIndex, after: int) -> None:
    """The writer's changes after ``after`` as one segment, as a shipper puts it (here by hand, to lay out
    overlaps that a writer of an earlier release, or a put that landed late, leaves in the bucket)."""
    version, batch = writer.changes_after(after)
    key = bucket.keys("default").segment(1, version, batch.after, batch.through)
    bucket.put_bytes(key, segments.encode(batch, version))


def test_a_replica_applies_a_segment_that_overlaps_its_position(tmp_path: Path, bucket, pair) -> None:
    """Segments hold final document states, so one that starts before the replica's position and ends past it
    applies as well: tail 3-5, then 3-6 (the first put's answer was lost), then 6-7."""
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work")
    writer.upsert(docs(3, 1, "a"))
    step(ship)  # the base
    step(follower)
    base = writer.position()[1]
    writer.upsert(docs(2, 2, "b"))
    put_segment(bucket, writer, base)
    step(follower)
    writer.upsert(docs(1, 3, "c"))
    put_segment(bucket, writer, base)  # starts where the first did, ends past it
    step(follower)
    assert everything(replica) == everything(writer), "the overlapping segment was skipped"
    writer.upsert(docs(1, 4, "d"))
    put_segment(bucket, writer, follower.position(replica).seq)
    step(follower)
    step(follower)
    assert everything(replica) == everything(writer) and follower.error is None
    assert follower.position(replica).seq == writer.position()[1]


def test_a_replica_copied_from_a_base_takes_the_segment_that_straddles_it(
    tmp_path: Path, bucket, pair
) -> None:
    """A base at 10 with the tail 3-9, 9-11 (a writer of an earlier release restarted after the base): the
    replica copied from the base takes 9-11 and what follows."""
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    writer.upsert(docs(3, 1, "a"))
    step(ship)  # the first base
    first = writer.position()[1]
    writer.upsert(docs(2, 2, "b"))
    put_segment(bucket, writer, first)
    last_through = writer.position()[1]
    writer.upsert(docs(2, 3, "c"))
    ship._ship_base(writer)  # a base past the last segment
    writer.upsert(docs(1, 4, "d"))
    put_segment(bucket, writer, last_through)  # resumed from the last segment, behind the base

    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work")
    step(follower)  # the base
    step(follower)
    assert everything(replica) == everything(writer), "the segment across the base was skipped"
    writer.upsert(docs(1, 5, "e"))
    put_segment(bucket, writer, follower.position(replica).seq)
    step(follower)
    step(follower)
    assert everything(replica) == everything(writer) and "e0" in everything(replica)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def test_a_replica_with_a_gap_in_its_tail_says_so_once_and_copies_the_next_base(
    tmp_path: Path, bucket, pair, caplog, monkeypatch
) -> None:
    """A segment that never reached the bucket and a base that is not past it: the replica keeps serving what
    it holds, reports why (not caught up), logs it once over many polls (no traceback), and copies the
    writer's next base by itself."""
    writer, replica = pair
    ship = shipper(writer, bucket, 1, "writer", tmp_path)
    follower = Follower(lambda: replica, bucket, bucket.keys("default"), tmp_path / "r.work", interval=0.01)
    writer.upsert(docs(3, 1, "a"))
    step(ship)
    step(follower)
    held = writer.position()[1]
    writer.upsert(docs(2, 2, "b"))
    lost = writer.position()[1]  # the segment through here is lost
    writer.upsert(docs(1, 3, "c"))
    put_segment(bucket, writer, lost)
    listings = []
    list_after = bucket.list_after
    monkeypatch.setattr(bucket, "list_after", lambda *a: listings.append(a) or list_after(*a))
    caplog.set_level(logging.INFO, logger="index.replication")
    follower.start()
    try:
        wait_for(lambda: follower.error is not None, "the gap to be reported")
        polls = len(listings)
        wait_for(lambda: len(listings) > polls + 20, "more polls")
        state = follower.status(replica, stale_after=60)
        assert f"does not continue from sequence {held}" in state["error"] and "newer base" in state["error"]
        assert state["stale"] and state["applied_seq"] == held
        logged = [r for r in caplog.records if r.name.startswith("index.replication")]
        assert [(r.levelno, r.exc_info) for r in logged] == [(logging.WARNING, None)], logged

        ship._ship_base(writer)  # the writer's next base (base_every, a rebuild) closes the gap
        # (no position for a moment: the copy is restored, then its position written)
        wait_for(lambda: follower.status(replica, 60)["applied_seq"] == writer.position()[1], "the copy")
        wait_for(lambda: follower.error is None, "the error to clear")
    finally:
        follower.stop()
    assert everything(replica) == everything(writer)
