"""A read-only replica follows a writer on the same folder through its changelog (issue 42): as a WAL reader
while the writer has the store open, immutable only while none has, and it switches when one appears."""

from __future__ import annotations

from pathlib import Path

from index.records import Document
from index.search_index import SearchIndex
from tests.index.conftest import tiny_documents


def docs(count: int, seed: int, prefix: str) -> list[Document]:
    return [
        Document(f"{prefix}{i}", r["text"], {"color": r["color"]})
        for i, r in enumerate(tiny_documents(count, seed))
    ]


def test_a_replica_beside_a_live_writer_sees_each_commit(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    writer = SearchIndex.open(root, tiny_encoder)
    writer.upsert(docs(5, 1, "a"))
    replica = SearchIndex.open(root, tiny_encoder, read_only=True)
    try:
        assert not replica._live.store.immutable  # the writer's WAL is there
        for step in range(3):
            batch = docs(4, 10 + step, f"s{step}-")
            writer.upsert(batch)
            assert replica.reload_if_changed()
            assert all(replica.get(d.id) == d for d in batch)
            hits = replica.search(None, batch[0].text, top_k=1, mode="bm25", filters={"color": "red"})
            assert hits and hits[0].metadata["color"] == "red"
        assert replica.stats() == writer.stats()
    finally:
        replica.close()
        writer.close()


def test_a_replica_opened_with_no_writer_switches_when_one_starts(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    writer = SearchIndex.open(root, tiny_encoder)
    writer.upsert(docs(5, 1, "a"))
    writer.close()  # checkpointed, no WAL left: the replica may read the file as immutable (a read-only mount)
    replica = SearchIndex.open(root, tiny_encoder, read_only=True)
    try:
        assert replica._live.store.immutable
        writer = SearchIndex.open(root, tiny_encoder)
        writer.upsert([Document("later", "queen king paris river", {"color": "blue"})])
        replica.reload_if_changed()
        assert not replica._live.store.immutable
        assert replica.get("later") is not None and replica.stats() == writer.stats()
        writer.close()
    finally:
        replica.close()
