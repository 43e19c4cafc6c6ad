"""FAISS wrapper: factory by size, removal (native or tombstones), per-call search parameters, atomic save."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import faiss
import numpy as np
import pytest

from index.records import DamagedFile
from index.storage.vectors import VectorIndex, choose_factory


def unit_vectors(count: int, dimension: int = 32, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(count, dimension)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_factory_follows_corpus_size() -> None:
    assert choose_factory(10_000, 384) == "IDMap2,Flat"
    assert choose_factory(200_000, 384).startswith("IVF") and choose_factory(200_000, 384).endswith(",Flat")
    assert choose_factory(2_000_000, 384).endswith("PQ48x8")


def test_removal_native_and_tombstoned(tmp_path: Path) -> None:
    vectors = unit_vectors(300)
    ids = np.arange(1000, 1300, dtype=np.int64)
    for factory in ("IDMap2,Flat", "IVF8,Flat", "IDMap2,HNSW16"):
        index = VectorIndex.create(factory, 32)
        index.train(vectors)
        index.add(ids, vectors)
        index.remove([1005, 1006])
        assert index.ntotal == 298, factory
        _, found = index.search(vectors[5], 5, overrides={"nprobe": 8})
        assert 1005 not in found and len(found) == 5, factory
        index.save(tmp_path / f"{factory}.faiss", {"synced_seq": 3})
        loaded, meta = VectorIndex.load(tmp_path / f"{factory}.faiss")
        assert meta["synced_seq"] == 3 and loaded.ntotal == 298
        assert 1006 not in loaded.search(vectors[6], 5, overrides={"nprobe": 8})[1]
    assert VectorIndex.load(tmp_path / "IDMap2,HNSW16.faiss")[0].tombstones == {1005, 1006}


def test_selector_restricts_before_top_k_and_parameters_are_per_call() -> None:
    vectors = unit_vectors(2000, seed=1)
    ids = np.arange(2000, dtype=np.int64)
    index = VectorIndex.create("IVF16,Flat", 32)
    index.train(vectors)
    index.add(ids, vectors)
    allowed = np.arange(0, 2000, 97, dtype=np.int64)
    _, found = index.search(vectors[3], 10, allowed=allowed, overrides={"nprobe": 16})
    assert len(found) == 10 and set(found) <= set(allowed.tolist())
    expected = {p: index.search(vectors[7], 20, overrides={"nprobe": p})[1].tolist() for p in (1, 16)}
    assert expected[1] != expected[16]  # nprobe matters for this query...
    with ThreadPoolExecutor(4) as pool:  # ...and concurrent calls with different nprobe do not interfere
        results = list(
            pool.map(
                lambda p: (p, index.search(vectors[7], 20, overrides={"nprobe": p})[1].tolist()), [1, 16] * 50
            )
        )
    assert all(found == expected[p] for p, found in results)


def test_a_saved_hnsw_graph_that_points_outside_itself_is_refused(tmp_path: Path) -> None:
    """A search follows the graph's entry point and neighbour ids as memory offsets: FAISS's reader checks them
    from the version pyproject requires (what is tested here), so a damaged graph is rebuilt from the store
    (``DamagedFile``) instead of read out of bounds."""
    index = VectorIndex.create("IDMap2,HNSW16", 32)
    index.add(np.arange(100, dtype=np.int64), unit_vectors(100))
    path = tmp_path / "hnsw.faiss"

    def entry_point(hnsw) -> None:
        hnsw.entry_point = 10**6

    def neighbour(hnsw) -> None:
        ids = faiss.vector_to_array(hnsw.neighbors)
        ids[5] = 10**6
        faiss.copy_array_to_vector(ids, hnsw.neighbors)

    for damage in (entry_point, neighbour):
        index.save(path, {})
        graph = faiss.read_index(str(path))
        damage(faiss.downcast_index(graph.index).hnsw)
        faiss.write_index(graph, str(path))
        with pytest.raises(DamagedFile, match="HNSW"):
            VectorIndex.load(path)
