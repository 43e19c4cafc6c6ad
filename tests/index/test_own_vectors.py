"""Collections of the caller's own vectors in-process (no model, no server): the checks on a supplied vector,
one chunk per document, dense/BM25/hybrid search, and snapshots that restore only into the same shape."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from harness.archives import STORE, edited_store, pack, unpack
from index.archive.restore import restore_offline
from index.archive.snapshots import BadArchive
from index.build.builder import attach_vectors
from index.build.own_vectors import InvalidVector, OwnVectors, OwnVectorsOnly
from index.collections import CollectionError, CollectionInfo, create_collection, read_info
from index.records import Document, DocumentLimits
from index.search_index import SearchIndex, import_rules
from index.text.chunking import Chunker, WholeDocuments


def test_a_supplied_vector_is_checked_and_shaped():
    cosine, dot = OwnVectors(3), OwnVectors(3, "dot")
    assert np.allclose(cosine.vector([3, 0, 4], "v"), [0.6, 0, 0.8])  # unit length for cosine
    assert np.allclose(dot.vector([3, 0, 4], "v"), [3, 0, 4])  # as given for dot
    for bad, why in (([1, 2], "2 numbers"), ([1, math.nan, 0], "NaN"), ([1, math.inf, 0], "infinity"),
                     ([1, 1e39, 0], "float32"), ([0, 0, 0], "all zeros")):  # fmt: skip
        with pytest.raises(InvalidVector, match=why) as refused:
            cosine.vector(bad, "4.vector")
        assert refused.value.field == "4.vector"
    assert np.allclose(dot.vector([0, 0, 0], "v"), 0)  # a zero vector is fine for dot
    with pytest.raises(OwnVectorsOnly):
        cosine.embed(["text"])
    with pytest.raises(ValueError, match="metric"):
        OwnVectors(3, "l2")


def test_documents_stay_whole():
    chunker = Chunker.for_encoder(OwnVectors(2))
    long_text = "word " * 5000
    assert isinstance(chunker, WholeDocuments) and [len(c) for c in chunker.split([long_text, "x"])] == [1, 1]


def test_an_own_vectors_collection_end_to_end(tmp_path: Path):
    info = CollectionInfo("shapes", None, dimension=2, metric="cosine")
    folder = create_collection(tmp_path, info, info.own_vectors())
    assert read_info(folder) == info
    index = SearchIndex.open(folder, info.own_vectors(), create=False)
    try:
        shape = index.encoder
        docs = [Document("east", "sunrise over the sea"), Document("north", "polar ice", {"cold": True})]
        vectors = np.stack([shape.vector([1, 0.1], "0"), shape.vector([0.1, 1], "1")])
        index.commit(attach_vectors(index.prepare(docs), vectors))
        assert [h.id for h in index.search(shape.vector([0, 1], "q"), "", mode="dense")] == ["north", "east"]
        assert [h.id for h in index.search(None, "polar", mode="bm25")] == ["north"]
        hybrid = index.search(shape.vector([1, 0], "q"), "sunrise", mode="hybrid", top_k=1)
        assert [h.id for h in hybrid] == ["east"]
        assert [h.id for h in index.search(shape.vector([1, 0], "q"), "", filters={"cold": True})] == [
            "north"
        ]
        snapshot = index.snapshot(tmp_path / "snaps")
        index.delete("east")
        assert index.restore(tmp_path / "snaps" / snapshot["name"])["documents"] == 2
        assert index.get("east") is not None
    finally:
        index.close()
    trained = CollectionInfo("ivf", None, "IVF4,Flat", dimension=2)
    with pytest.raises(CollectionError, match="needs training"):  # it would never be trained: no rebuilds
        create_collection(tmp_path, trained, trained.own_vectors())
    other = CollectionInfo("wider", None, dimension=3)
    wider = SearchIndex.open(create_collection(tmp_path, other, other.own_vectors()), other.own_vectors())
    try:
        with pytest.raises(BadArchive, match="dimension"):  # a snapshot restores only into the same shape
            wider.restore(tmp_path / "snaps" / snapshot["name"])
    finally:
        wider.close()


def test_a_restore_checks_each_vector_as_an_upsert_does(tmp_path: Path):
    """A cosine collection's archive: a zero vector is refused as an upsert refuses it, vectors that are not of
    unit length are normalised as an upsert normalises them, and documents without text (which a collection
    of the caller's own vectors takes) restore, through the service and offline."""
    info = CollectionInfo("unit", None, dimension=2, metric="cosine")
    index = SearchIndex.open(create_collection(tmp_path, info, info.own_vectors()), info.own_vectors())
    try:
        shape = index.encoder
        docs = [Document("a", ""), Document("b", "words")]
        index.commit(
            attach_vectors(
                index.prepare(docs), np.stack([shape.vector([1, 0], "0"), shape.vector([0, 1], "1")])
            )
        )
        members = unpack((tmp_path / "snaps" / index.snapshot(tmp_path / "snaps")["name"]).read_bytes())

        def vectors_set_to(value: list[float]) -> Path:
            blob = np.asarray(value, np.float32).tobytes()
            store = edited_store(members[STORE], lambda c: c.execute("UPDATE chunks SET vector = ?", (blob,)))
            path = tmp_path / "edited.tar"
            path.write_bytes(pack(members | {STORE: store}))
            return path

        with pytest.raises(BadArchive, match="all zeros"):
            index.restore(vectors_set_to([0, 0]))
        assert index.restore(vectors_set_to([3, 4]))["documents"] == 2
        hit = index.search(shape.vector([3, 4], "q"), "", top_k=1)[0]
        assert math.isclose(hit.score, 1.0, rel_tol=1e-5)  # stored as the unit vector (0.6, 0.8)
    finally:
        index.close()
    restored = restore_offline(
        tmp_path / "offline", tmp_path / "edited.tar", import_rules(shape, DocumentLimits())
    )
    assert restored["documents"] == 2
