"""The registry of replicated collections (``index.replication.registry``) against moto's in-memory S3: what a
writer publishes is what a replica reads, it is replaced only when it changes, its epoch fences the whole
prefix, and the folders of collections it stopped listing are deleted. The loopback tier (tests/replication/) runs it between `cloze serve` processes."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from index.collections import CollectionInfo
from index.replication.bucket import Bucket, Fenced
from index.replication.garbage import Sweeper
from index.replication.registry import Publisher, entry_of, info_of, read_listing, registry_key


@pytest.fixture
def bucket():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="replicas")
        yield Bucket("s3://replicas/team", client=client)


MODEL = CollectionInfo("legal", "minilm", factory="HNSW32", chunk_window=64, incarnation="a1")
OWN = CollectionInfo("images", None, dimension=4, metric="dot", incarnation="b2")


def test_a_replica_reads_the_collections_the_writer_published(bucket: Bucket) -> None:
    assert read_listing(bucket) is None  # nothing published yet: a replica follows default only
    publisher = Publisher(bucket, 1, "writer-a")
    publisher.publish({c.name: entry_of(c) for c in (MODEL, OWN)})
    assert registry_key(bucket) == "team/collections.json"
    assert read_listing(bucket) == {"legal": MODEL, "images": OWN}
    assert publisher.listed("legal", "a1") and not publisher.listed("legal", "other")
    assert not publisher.listed("default", None)  # default is never listed: every replica follows it


def test_the_registry_is_replaced_only_when_the_collections_change(bucket: Bucket) -> None:
    publisher = Publisher(bucket, 1, "writer-a")
    publisher.publish({"legal": entry_of(MODEL)})
    etag = bucket.etag(registry_key(bucket))
    publisher.publish({"legal": entry_of(MODEL)})
    assert bucket.etag(registry_key(bucket)) == etag
    again = CollectionInfo("legal", "minilm", incarnation="c3")  # deleted and made again: another one
    publisher.publish({"legal": entry_of(again)})
    assert bucket.etag(registry_key(bucket)) != etag
    assert read_listing(bucket) == {"legal": again}
    publisher.publish({})
    assert read_listing(bucket) == {}


def test_a_writer_restarted_on_its_volume_takes_its_registry_back(bucket: Bucket) -> None:
    Publisher(bucket, 1, "writer-a").publish({"legal": entry_of(MODEL)})
    restarted = Publisher(bucket, 1, "writer-a")
    restarted.publish({"legal": entry_of(MODEL), "images": entry_of(OWN)})
    assert set(read_listing(bucket) or {}) == {"legal", "images"}


def test_the_registry_fences_every_collection_of_an_older_or_twin_writer(bucket: Bucket) -> None:
    zombie = Publisher(bucket, 1, "writer-a")
    zombie.publish({"legal": entry_of(MODEL)})
    promoted = Publisher(bucket, 2, "writer-b")
    promoted.publish({"legal": entry_of(MODEL), "images": entry_of(OWN)})
    with pytest.raises(Fenced, match="epoch 2"):
        zombie.check()  # the object changed under it: read again, a newer epoch
    with pytest.raises(Fenced, match="epoch 2"):
        zombie.publish({})
    twin = Publisher(bucket, 2, "writer-c")
    with pytest.raises(Fenced, match="another writer"):
        twin.publish({})
    assert set(read_listing(bucket) or {}) == {"legal", "images"}  # the promoted writer's, untouched


def test_a_put_that_loses_a_race_reads_again_before_it_writes(bucket: Bucket) -> None:
    first = Publisher(bucket, 1, "writer-a")
    first.publish({"legal": entry_of(MODEL)})
    promoted = Publisher(bucket, 2, "writer-b")
    promoted.check()
    bucket.put_json(  # another writer's put lands between its read and its conditional put
        registry_key(bucket),
        {"format": 1, "epoch": 3, "writer": "writer-z", "collections": {}},
    )
    with pytest.raises(Fenced, match="epoch 3"):
        promoted.publish({"images": entry_of(OWN)})


def test_an_entry_from_a_later_release_is_read_without_its_new_fields(bucket: Bucket) -> None:
    assert info_of(entry_of(OWN) | {"a_later_field": 1}) == OWN
    bucket.put_json(registry_key(bucket), {"format": 99, "epoch": 1, "collections": {}})
    with pytest.raises(ValueError, match="format 99"):
        read_listing(bucket)
    raw = bucket.get_bytes(registry_key(bucket))[0]
    assert json.loads(raw or b"{}")["format"] == 99


def test_the_writer_deletes_only_the_folders_its_registry_stopped_listing(bucket: Bucket) -> None:
    doomed = [
        "team/legal@old/CURRENT.json",  # legal deleted and made again: legal@a1 is listed now
        "team/legal@old/e1/heartbeat.json",
        "team/legal@old/e1/v1/base-000000000000.tar",
        "team/gone/e1/v1/tail/000000000000-000000000002.json.gz",  # made before incarnations
    ]
    kept = [
        "team/default/CURRENT.json",  # never listed, always kept
        "team/legal@a1/CURRENT.json",
        "team/legal@old/notes.txt",  # not replication's
        "team/nested/default/CURRENT.json",  # a deployment under a longer prefix
        "elsewhere/legal@old/CURRENT.json",  # outside the prefix
    ]
    for key in doomed + kept:
        bucket.put_bytes(key, b"{}")
    publisher = Publisher(bucket, 1, "writer-a")
    sweeper = Sweeper(publisher, grace_s=0)
    assert sweeper.sweep() == []  # nothing before this writer has published its registry
    publisher.publish({"legal": entry_of(MODEL)})
    assert Sweeper(publisher, grace_s=3600).sweep() == []  # unlisted and written just now
    promoted = Publisher(bucket, 2, "writer-b")
    promoted.publish({"legal": entry_of(MODEL)})
    assert sweeper.sweep() == []  # fenced: another epoch holds the registry
    assert set(bucket.list_after("", "")) == set(doomed + kept) | {registry_key(bucket)}

    # a promoted writer deletes only what it listed itself, never a collection it did not hold
    assert Sweeper(promoted, grace_s=0).sweep() == []
    held_once = {
        "legal": {**entry_of(MODEL), "incarnation": "old"},
        "gone": {**entry_of(MODEL), "incarnation": None},
    }
    promoted.publish(held_once)
    promoted.publish({"legal": entry_of(MODEL)})
    assert sorted(Sweeper(promoted, grace_s=0).sweep()) == sorted(doomed)
    assert set(bucket.list_after("", "")) == set(kept) | {registry_key(bucket)}
