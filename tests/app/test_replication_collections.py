"""Every collection replicated, in one process against moto's in-memory S3: a writer's service lists its
collections in the registry and is fenced by a newer one; a replica's service creates what is listed,
follows it under the writer's incarnation, drops a collection made again before copying the new one, and
reports one whose model it lacks. Each round of the loop is driven by hand; the loopback tier
(tests/replication/, test 10) runs the same between `cloze serve` processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from app.service.collections import CollectionRegistry
from app.service.engines import Engines
from app.service.errors import ApiError
from app.service.lifecycle import Lifecycle
from app.service.metrics import Metrics
from app.service.model_registry import ModelRegistry
from app.service.replication import Replica, Replication, Unreplicated, Writer, replication_for
from app.settings import Settings
from index.collections import DEFAULT_COLLECTION, CollectionInfo, read_info
from index.replication.bucket import Bucket, Fenced
from index.replication.registry import Publisher, entry_of, read_listing
from index.replication.worker import Worker

URL = "s3://replicas/team"


@pytest.fixture
def bucket(monkeypatch):
    # The workers' threads are not started: these tests drive the service's rounds, not the shipping
    # (tests/index/test_replication.py steps shippers and followers by hand).
    monkeypatch.setattr(Worker, "start", lambda self: None)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="replicas")
        yield Bucket(URL, client=client)


def service(tmp_path: Path, role: str, bucket: Bucket, epoch: int = 1) -> Replication:
    settings = Settings(
        index=tmp_path / role / "idx",
        collections_dir=tmp_path / role / "collections",
        replication_role=role,
        replication_bucket=URL,
        replication_epoch=epoch,
    )
    registry = CollectionRegistry(settings.collections_root)
    models = ModelRegistry("embedding")
    lifecycle = Lifecycle(registry, models, settings, Metrics())
    engines = Engines(models=models, collections=registry)
    replication = replication_for(settings, engines, lifecycle)
    replication.bucket = bucket  # what ``run`` makes from the settings
    return replication


def own(name: str, incarnation: str, metric: str = "cosine") -> CollectionInfo:
    return CollectionInfo(
        name, None, dimension=4, metric=metric, incarnation=incarnation, created="2026-01-01T00:00:00+00:00"
    )


def test_a_replica_mirrors_the_registry_and_never_follows_another_incarnation(
    tmp_path: Path, bucket: Bucket
) -> None:
    writer = Publisher(bucket, 1, "writer-a")
    replica = service(tmp_path, "replica", bucket)
    assert isinstance(replica, Replica)

    async def scenario() -> None:
        writer.publish(
            {"vecs": entry_of(own("vecs", "i1")), "legal": entry_of(CollectionInfo("legal", "lm"))}
        )
        await replica._sync()
        served = replica.collections.collections
        assert set(served) == {DEFAULT_COLLECTION, "vecs"}
        copy = served["vecs"]
        assert copy.replica and copy.index is not None  # writes answer 409 there
        assert read_info(copy.path).incarnation == "i1"  # the writer's, so the same bucket folder
        assert replica.workers["vecs"].worker.keys.root == "team/vecs@i1"
        assert replica.workers["vecs"].worker.stage() == "replication-vecs"  # its own crash-test pause point
        state = replica.status()
        assert state["vecs"]["incarnation"] == "i1"
        assert "'lm' is not configured here" in state["legal"]["error"]
        assert "CLOZE_MODELS" in state["legal"]["error"]

        writer.publish({"vecs": entry_of(own("vecs", "i2", "dot"))})  # deleted and made again
        old_worker = replica.workers["vecs"].worker
        await replica._sync()
        assert old_worker._stop.is_set()  # stopped before its collection closed
        assert copy.index is None and served["vecs"] is not copy
        assert read_info(served["vecs"].path) == own("vecs", "i2", "dot")
        assert replica.workers["vecs"].worker.keys.root == "team/vecs@i2"
        assert "legal" not in replica.status()  # no longer listed: no longer reported

        writer.publish({})
        await replica._sync()
        assert set(served) == {DEFAULT_COLLECTION} and "vecs" not in replica.workers

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(replica.lifecycle.close_all())


def test_a_writer_lists_its_collections_and_a_newer_epoch_fences_them_all(
    tmp_path: Path, bucket: Bucket
) -> None:
    writer = service(tmp_path, "writer", bucket)
    assert isinstance(writer, Writer)
    writer.publisher = Publisher(bucket, 1, "writer-a")

    async def scenario() -> None:
        async with writer.lifecycle.created(own("vecs", "i1"), own("vecs", "i1").own_vectors()):
            pass
        await writer._sync()
        assert read_listing(bucket) == {"vecs": own("vecs", "i1")}
        assert {"vecs", DEFAULT_COLLECTION} == set(writer.workers)
        for replicated in writer.workers.values():  # each shipper's first step: its CURRENT.json read
            replicated.worker._read_current()
        assert writer.admit("vecs", "remote") == "remote"

        Publisher(bucket, 2, "writer-b").publish({})  # another writer promoted
        with pytest.raises(Fenced, match="epoch 2"):
            await writer._sync()
        writer._fence("the bucket's collections.json is at epoch 2")
        assert all(r.worker._stop.is_set() for r in writer.workers.values())
        for name in ("vecs", DEFAULT_COLLECTION):
            with pytest.raises(ApiError) as refused:
                writer.admit(name, None)
            assert refused.value.status == 503
        assert writer.status()["vecs"]["fenced"]

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(writer.lifecycle.close_all())


def test_a_collection_withdrawn_for_a_delete_stays_listed_until_it_is_closed(
    tmp_path: Path, bucket: Bucket
) -> None:
    writer = service(tmp_path, "writer", bucket)
    writer.publisher = Publisher(bucket, 1, "writer-a")
    registry = writer.collections

    async def scenario() -> None:
        async with writer.lifecycle.created(own("vecs", "i1"), own("vecs", "i1").own_vectors()):
            pass
        await writer._sync()
        vecs = registry.withdraw("vecs")  # a delete waiting for the requests in flight
        await writer._sync()
        assert read_listing(bucket) == {"vecs": own("vecs", "i1")}  # replicas keep their copies
        registry.reinstate(vecs)  # the delete was refused (409)
        await writer._sync()
        assert read_listing(bucket) == {"vecs": own("vecs", "i1")}

        await writer.lifecycle.delete("vecs", lambda name: None)
        await writer._sync()
        assert read_listing(bucket) == {} and "vecs" not in registry.withdrawn

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(writer.lifecycle.close_all())


def test_without_a_role_nothing_is_replicated_reported_or_acknowledged_remotely(
    tmp_path: Path, bucket: Bucket
) -> None:
    off = service(tmp_path, "off", bucket)
    assert isinstance(off, Unreplicated)
    assert off.status() == {} and off.summary() is None and off.ready({})
    assert off.admit(DEFAULT_COLLECTION, None) == "local"
    with pytest.raises(ApiError) as refused:
        off.admit(DEFAULT_COLLECTION, "remote")
    assert refused.value.status == 422
