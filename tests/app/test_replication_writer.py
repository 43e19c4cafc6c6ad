"""A writer service against moto's in-memory S3, its rounds driven by hand (the shippers' threads are not
started): it takes no write before it has read the bucket, and a write waiting for the bucket (``ack=remote``)
waits on the event loop, not in the thread pool that probes and storage reads share."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from starlette.concurrency import run_in_threadpool

from app.service.errors import ApiError
from app.service.replication import Writer
from index.collections import DEFAULT_COLLECTION
from index.replication.bucket import Bucket, Fenced
from index.replication.registry import Publisher
from tests.app.test_replication_collections import bucket, own, service  # noqa: F401  (a fixture)


def read_bucket(writer: Writer) -> None:
    """What each shipper's first step does before anything else: read its collection's CURRENT.json."""
    for replicated in writer.workers.values():
        replicated.worker._read_current()


def test_a_writer_started_at_an_old_epoch_takes_no_write_before_its_first_check(
    tmp_path: Path,
    bucket: Bucket,  # noqa: F811
) -> None:
    Publisher(bucket, 2, "promoted").publish({})  # a replica was promoted while this writer was down
    writer = service(tmp_path, "writer", bucket, epoch=1)
    assert isinstance(writer, Writer)
    writer.publisher = Publisher(bucket, 1, "old")

    async def scenario() -> None:
        with pytest.raises(ApiError) as refused:  # it used to answer 200 until its first round
            writer.admit(DEFAULT_COLLECTION, None)
        assert refused.value.status == 503 and "not yet read" in refused.value.message
        assert refused.value.headers == {"Retry-After": "1"}
        with pytest.raises(ApiError) as creating:  # nor a collection made (or deleted, rebuilt, restored)
            writer.refuse_unless_writing("new")
        assert creating.value.status == 503 and "not yet read" in creating.value.message
        assert not writer.ready(writer.status())
        with pytest.raises(Fenced, match="epoch 2"):
            await writer._sync()

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(writer.lifecycle.close_all())


def test_a_writer_takes_writes_once_it_has_read_the_registry_and_each_current_json(
    tmp_path: Path,
    bucket: Bucket,  # noqa: F811
) -> None:
    writer = service(tmp_path, "writer", bucket)
    assert isinstance(writer, Writer)
    writer.publisher = Publisher(bucket, 1, "writer-a")

    async def scenario() -> None:
        async with writer.lifecycle.created(own("vecs", "i1"), own("vecs", "i1").own_vectors()):
            pass
        await writer._sync()  # the registry read; the shippers made, not stepped yet
        with pytest.raises(ApiError) as refused:
            writer.admit("vecs", None)
        assert refused.value.status == 503
        assert "not yet read" in writer.status()["vecs"]["waiting"]
        read_bucket(writer)
        assert writer.admit("vecs", None) == "local" and writer.ready(writer.status())
        assert writer.status()["vecs"]["waiting"] is None
        async with writer.lifecycle.created(own("new", "i2"), own("new", "i2").own_vectors()):
            pass
        assert writer.admit("new", None) == "local"  # made here after the check: nothing to read for it
        writer.refuse_unless_writing("another")  # checked: collections are made again

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(writer.lifecycle.close_all())


def test_writes_waiting_for_the_bucket_hold_no_thread_of_the_pool(
    tmp_path: Path,
    bucket: Bucket,  # noqa: F811
) -> None:
    """120 remote-mode writes wait for a shipper that ships nothing (its thread never runs, as with the bucket
    paused); meanwhile what /readyz does in the thread pool answers at once. Then the shipper ships: every
    wait ends, each with its answer."""
    writer = service(tmp_path, "writer", bucket)
    writer.settings = writer.settings.model_copy(update={"replication_ack_timeout_s": 3.0})
    writer.publisher = Publisher(bucket, 1, "writer-a")

    async def acknowledged(many: int) -> list[BaseException | None]:
        vecs = writer.collections.collections["vecs"]
        waits = [writer.acknowledge("remote", vecs, vecs.index) for _ in range(many)]
        return await asyncio.gather(*waits, return_exceptions=True)

    async def scenario() -> None:
        async with writer.lifecycle.created(own("vecs", "i1"), own("vecs", "i1").own_vectors()):
            pass
        await writer._sync()
        read_bucket(writer)
        waiting = asyncio.create_task(acknowledged(120))
        await asyncio.sleep(0.5)  # every write is waiting now
        started = time.monotonic()
        await run_in_threadpool(writer.status)  # /readyz's call into the pool
        probe_s = time.monotonic() - started
        timed_out = await waiting
        assert probe_s < 0.5, f"/readyz's thread waited {probe_s:.1f} s behind the waiting writes"
        assert all(isinstance(r, ApiError) and r.status == 503 for r in timed_out), timed_out[:3]

        shipper = writer.workers["vecs"].worker
        waiting = asyncio.create_task(acknowledged(120))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await run_in_threadpool(shipper.step, shipper._generation)  # a base: everything so far is shipped
        assert await waiting == [None] * 120
        assert time.monotonic() - started < 2 and shipper.waiters == []

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(writer.lifecycle.close_all())
