"""A replica's restore of its writer's base: FAISS adopts the base's lists, renumbered as the import renumbered
the chunks, when they hold exactly the imported chunks under their vectors' codes; else it takes the base's
training when that is the sidecar's factory's; else it is trained again. The import writes its unpublished
store unjournaled."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import faiss
import numpy as np
import pytest

from harness.archives import pack, unpack
from index.archive import snapshots
from index.collections import CollectionInfo, create_collection
from index.records import Document
from index.search_index import SearchIndex
from index.storage import layout
from index.storage.vectors import VectorIndex, reusable_training
from tests.index.conftest import tiny_documents

FACTORY = "IVF4,PQ4x4"  # trained twice over (lists and codebooks), small enough for 80 tiny documents


def docs(count: int, seed: int) -> list[Document]:
    return [Document(f"r{i}", r["text"], {"n": i}) for i, r in enumerate(tiny_documents(count, seed))]


@pytest.fixture
def writer(tmp_path: Path, tiny_encoder):
    folder = create_collection(
        tmp_path / "c", CollectionInfo("ivf", "default", factory=FACTORY), tiny_encoder
    )
    index = SearchIndex.open(folder, tiny_encoder)
    index.upsert(docs(80, 5))
    index.rebuild()  # the collection's IVF-PQ factory applies at a rebuild
    index.delete("r3")
    index.upsert(docs(80, 5)[7:9])  # unchanged: kept; the archive's chunk ids have gaps, a restore renumbers
    index.upsert([Document("r9", "a new text for the ninth", {"n": 9})])
    yield index
    index.close()


@pytest.fixture
def replica(tmp_path: Path, tiny_encoder):
    index = SearchIndex.open(tmp_path / "replica", tiny_encoder)
    yield index
    index.close()


def centroids(index: SearchIndex) -> np.ndarray:
    ivf = faiss.extract_index_ivf(index._live.vectors.index)
    return ivf.quantizer.reconstruct_n(0, ivf.nlist)


def counting(monkeypatch, method: str) -> list[int]:
    """Each call of ``VectorIndex.<method>`` (train, add), by the rows it was given."""
    calls: list[int] = []
    original = getattr(VectorIndex, method)

    def counted(self: VectorIndex, *args: np.ndarray) -> None:
        calls.append(len(args[-1]))
        original(self, *args)

    monkeypatch.setattr(VectorIndex, method, counted)
    return calls


def expected() -> list[Document]:
    kept = [d for d in docs(80, 5) if d.id not in ("r3", "r9")]
    return [*kept, Document("r9", "a new text for the ninth", {"n": 9})]


def faiss_ids(index: SearchIndex) -> list[int]:
    ivf = faiss.extract_index_ivf(index._live.vectors.index)
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    return sorted(
        int(i)
        for number in range(ivf.nlist)
        for i in faiss.rev_swig_ptr(lists.get_ids(number), lists.list_size(number))
    )


def stored_ids(index: SearchIndex) -> list[int]:
    return [row[0] for row in index._live.store.query("SELECT id FROM chunks ORDER BY id")]


def assert_serves(index: SearchIndex, documents: list[Document]) -> None:
    stats = index.stats()
    assert stats["vectors"] == stats["chunks"] == len(documents)
    assert index._live.vectors.factory == FACTORY
    for document in documents[:8]:
        vector = index.encoder.embed([document.text], normalize=True)[0]
        assert document.id in [hit.id for hit in index.search(vector, document.text, top_k=5)]


def test_a_replicas_restore_adopts_the_bases_lists_renumbered(
    writer: SearchIndex, replica: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    archive = tmp_path / "snaps" / writer.snapshot(tmp_path / "snaps")["name"]
    trained, added = counting(monkeypatch, "train"), counting(monkeypatch, "add")
    replica.restore(archive, private=True)
    assert trained == [] and added == []
    assert stored_ids(replica) == list(range(1, 80)) != stored_ids(writer)  # renumbered
    assert faiss_ids(replica) == stored_ids(replica)
    np.testing.assert_array_equal(centroids(replica), centroids(writer))
    assert_serves(replica, expected())
    with sqlite3.connect(replica._live.store.path) as conn:  # the unjournaled import is back in WAL mode
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_an_uploaded_archives_faiss_file_is_never_read(
    writer: SearchIndex, replica: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    archive = tmp_path / "snaps" / writer.snapshot(tmp_path / "snaps")["name"]
    monkeypatch.setattr("index.archive.importer.read_training", pytest.fail)
    monkeypatch.setattr("index.archive.importer.read_index_file", pytest.fail)
    trained = counting(monkeypatch, "train")
    replica.restore(archive)
    assert len(trained) == 1
    assert_serves(replica, expected())


def nan_centroids(faiss_bytes: bytes) -> bytes:
    index = faiss.deserialize_index(np.frombuffer(faiss_bytes, np.uint8))
    ivf = faiss.extract_index_ivf(index)
    ivf.quantizer.reset()
    ivf.quantizer.add(np.full((ivf.nlist, ivf.d), np.nan, np.float32))
    return faiss.serialize_index(index).tobytes()


def other_factory(dimension: int, vectors: np.ndarray) -> bytes:
    index = VectorIndex.create("IVF8,PQ4x4", dimension)
    index.train(vectors)
    return faiss.serialize_index(index.index).tobytes()


def test_a_shipped_faiss_file_that_does_not_fit_is_trained_again(
    writer: SearchIndex, replica: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    """Checksums recomputed (as whoever holds the bucket's key could): a file that is not FAISS, one of
    another factory, one whose centroids are NaN. Each restores, trained on the imported vectors."""
    good = unpack((tmp_path / "snaps" / writer.snapshot(tmp_path / "snaps")["name"]).read_bytes())
    sample = writer._live.store.sample_vectors(80, writer.encoder.dimension)
    cases = {
        "not FAISS": b"not an index" * 40,
        "another factory": other_factory(writer.encoder.dimension, sample),
        "NaN centroids": nan_centroids(good[layout.VECTORS]),
    }
    trained = counting(monkeypatch, "train")
    for number, (case, body) in enumerate(cases.items()):
        archive = tmp_path / f"case{number}.tar"
        archive.write_bytes(pack(good | {layout.VECTORS: body}))
        replica.restore(archive, private=True)
        assert len(trained) == number + 1, case
        assert not np.isnan(centroids(replica)).any(), case
        assert_serves(replica, expected())


def swapped_codes(faiss_bytes: bytes) -> bytes:
    """Two chunks in different lists trade ids: each id then sits under the other's code."""
    index = faiss.deserialize_index(np.frombuffer(faiss_bytes, np.uint8))
    ivf = faiss.extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    full = [n for n in range(ivf.nlist) if lists.list_size(n)]
    first, second = (faiss.rev_swig_ptr(lists.get_ids(n), lists.list_size(n)) for n in full[:2])
    first[0], second[0] = int(second[0]), int(first[0])
    return faiss.serialize_index(index).tobytes()


def test_shipped_lists_that_are_not_the_imported_chunks_are_added_again(
    writer: SearchIndex, replica: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    """Two ids traded between lists (the codes no longer their vectors'), FAISS trailing the store (a write
    committed but not yet in FAISS when the base was cut): the training is reused, the vectors added."""
    swapped = unpack((tmp_path / "snaps" / writer.snapshot(tmp_path / "snaps")["name"]).read_bytes())
    swapped[layout.VECTORS] = swapped_codes(swapped[layout.VECTORS])
    monkeypatch.setattr("index.search_index.apply_changes", lambda version, lock: 0)
    writer.upsert([Document("late", "a write FAISS has not caught up with", {"n": 0})])
    monkeypatch.undo()
    trailing = tmp_path / "snaps" / writer.snapshot(tmp_path / "snaps")["name"]
    trained, added = counting(monkeypatch, "train"), counting(monkeypatch, "add")
    (tmp_path / "swapped.tar").write_bytes(pack(swapped))
    for number, archive in enumerate((tmp_path / "swapped.tar", trailing)):
        replica.restore(archive, private=True)
        assert trained == [] and len(added) == number + 1
        assert faiss_ids(replica) == stored_ids(replica)
    assert_serves(replica, [*expected(), Document("late", "a write FAISS has not caught up with")])


def test_a_shipped_faiss_file_that_differs_from_its_checksum_is_refused(
    writer: SearchIndex, replica: SearchIndex, tmp_path: Path
) -> None:
    good = unpack((tmp_path / "snaps" / writer.snapshot(tmp_path / "snaps")["name"]).read_bytes())
    info = json.loads(good[snapshots.INFO])
    flipped = bytearray(good[layout.VECTORS])
    flipped[len(flipped) // 2] ^= 0x01
    archive = tmp_path / "flipped.tar"
    archive.write_bytes(pack(good | {layout.VECTORS: bytes(flipped)}, info=info, checksums=False))
    with pytest.raises(snapshots.BadArchive, match="vectors.faiss is corrupted"):
        replica.restore(archive, private=True)
    assert replica.stats()["documents"] == 0


def test_reusable_training_takes_only_an_index_of_the_same_factory() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((400, 16)).astype(np.float32)
    shipped = VectorIndex.create("IVF4,PQ4x8", 16)
    shipped.train(vectors)
    shipped.add(np.arange(400), vectors)
    emptied = reusable_training(shipped.index, VectorIndex.create("IVF4,PQ4x8", 16).index)
    assert emptied.is_trained and emptied.ntotal == 0
    for factory in ("IVF8,PQ4x8", "IVF4,PQ8x8", "IVF4,PQ4x4", "IVF4,Flat", "IDMap2,Flat"):
        with pytest.raises(ValueError):
            reusable_training(shipped.index, VectorIndex.create(factory, 16).index)
    with pytest.raises(ValueError):  # of another dimension
        reusable_training(shipped.index, VectorIndex.create("IVF4,PQ4x8", 32).index)
