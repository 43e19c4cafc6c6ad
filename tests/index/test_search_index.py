"""SearchIndex mechanics with the tiny random encoder: updates, durability, filters, modes, concurrency, rebuild."""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from index.build.builder import attach_vectors, chunk_texts
from index.records import Document, IndexModelMismatch, ReadOnlyIndex, UnknownFilterField
from index.search_index import SearchIndex
from index.storage import changelog, layout, lexical
from index.storage.columns import Columns
from index.storage.store import DocumentStore
from index.storage.vectors import VectorIndex
from index.storage.version import OpenVersion
from tests.index.conftest import tiny_documents


def docs(count: int, seed: int = 0) -> list[Document]:
    return [
        Document(r["_id"], r["text"], {"color": r["color"], "rank": r["rank"]})
        for r in tiny_documents(count, seed)
    ]


@pytest.fixture()
def index(tmp_path: Path, tiny_encoder):
    opened = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    yield opened
    opened.close()


def vector(encoder, text: str) -> np.ndarray:
    return encoder.embed([text], normalize=True)[0]


def test_upsert_is_searchable_and_durable(index: SearchIndex, tiny_encoder, tmp_path: Path) -> None:
    corpus = docs(60)
    assert index.stats() == {"documents": 0, "chunks": 0, "vectors": 0}
    assert index.upsert(corpus) == 60
    assert index.stats() == {"documents": 60, "chunks": 60, "vectors": 60}
    target = corpus[17]
    top = index.search(vector(tiny_encoder, target.text), target.text, top_k=3)
    assert top[0].id == target.id and top[0].text == target.text and top[0].chunk == target.text
    assert top[0].score == pytest.approx(1.0, abs=1e-4)
    assert top[0].metadata == {"color": "blue", "rank": 17}
    # A second instance (another replica / a restart) sees the committed documents without a rebuild.
    other = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    assert other.get(target.id) == target
    assert other.search(vector(tiny_encoder, target.text), "", top_k=1)[0].id == target.id
    index.upsert([Document("late", "queen king river paris france capital")])
    assert other.reload_if_changed() is True
    assert (
        other.search(vector(tiny_encoder, "queen king river paris france capital"), "", top_k=1)[0].id
        == "late"
    )
    assert other.reload_if_changed() is False
    other.close()


def test_replace_and_delete(index: SearchIndex, tiny_encoder) -> None:
    index.upsert(docs(20))
    index.upsert([Document("d3", "guitar music guitar music", {"color": "none"})])
    assert index.stats()["documents"] == 20 and index.stats()["vectors"] == 20
    assert index.get("d3").metadata == {"color": "none"}
    assert index.search(None, "guitar", mode="bm25", top_k=1)[0].id == "d3"
    assert index.delete("d3") is True and index.delete("d3") is False
    assert index.get("d3") is None
    assert all(
        hit.id != "d3"
        for hit in index.search(vector(tiny_encoder, "guitar music"), "guitar music", top_k=20, mode="hybrid")
    )
    assert index.stats() == {"documents": 19, "chunks": 19, "vectors": 19}


def test_filters_apply_before_top_k(index: SearchIndex, tiny_encoder) -> None:
    corpus = docs(90)
    index.upsert(corpus)
    query = vector(tiny_encoder, corpus[0].text)
    for mode in ("dense", "hybrid", "bm25"):
        hits = index.search(query, corpus[0].text, top_k=10, mode=mode, filters={"color": "green"})
        assert hits and all(h.metadata["color"] == "green" for h in hits), mode
        if mode != "bm25":  # every green document is a candidate: exactly k come back
            assert len(hits) == 10
    chosen = index.search(query, "", top_k=5, filters={"rank": [4, 7, 88]})
    assert sorted(h.id for h in chosen) == ["d4", "d7", "d88"]
    for mode in ("dense", "hybrid", "bm25"):  # a field no document has: nothing matches, its negation all
        assert index.search(query, "king", mode=mode, filters={"colour": "red"}) == []
        assert index.search(query, "", mode=mode, filters={"rank": {"$gt": None}}) == []
        assert len(index.search(query, "", top_k=90, filters={"colour": {"$nin": ["red"]}})) == 90
    with pytest.raises(UnknownFilterField):
        index.check_filter_fields({"$or": [{"color": "red"}, {"colour": "red"}]})
    assert index.metadata_fields() == {"color", "rank"}


def test_bm25_query_text_is_sanitised(index: SearchIndex) -> None:
    index.upsert(docs(10))
    for text in ['"foo', "AND(", "cat OR", "NEAR(a b", "*", "col:cat", "", "-", "a'b\"c", "the"]:
        index.search(None, text, mode="bm25")  # must not raise
    hits = index.search(None, 'king" AND( queen', mode="bm25", top_k=10)
    assert hits and all("king" in h.text or "queen" in h.text for h in hits)


def test_model_mismatch_is_refused(tmp_path: Path, tiny_encoder, bundled_torch) -> None:
    SearchIndex.open(tmp_path / "idx", tiny_encoder).close()
    with pytest.raises(IndexModelMismatch) as caught:
        SearchIndex.open(tmp_path / "idx", bundled_torch)
    message = str(caught.value)
    assert tiny_encoder.info.fingerprint in message and bundled_torch.info.fingerprint in message


def test_concurrent_searches_and_upserts(index: SearchIndex, tiny_encoder) -> None:
    index.upsert(docs(50))
    queries = [vector(tiny_encoder, d.text) for d in docs(50)]
    errors: list[BaseException] = []

    def search(i: int) -> None:
        try:
            hits = index.search(queries[i % 50], "cat dog", top_k=5, mode="hybrid" if i % 2 else "dense")
            assert len(hits) == 5
        except BaseException as exc:
            errors.append(exc)

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(search, i) for i in range(200)]
        for batch in range(5):
            index.upsert([Document(f"new{batch}-{j}", f"king queen {batch} {j}") for j in range(10)])
        for future in futures:
            future.result()
    assert not errors
    assert index.stats() == {"documents": 100, "chunks": 100, "vectors": 100}


@pytest.mark.parametrize("snapshot_every", [10_000, 1])  # 1: a snapshot prunes after every write
def test_rebuild_swaps_versions_without_losing_writes(
    index: SearchIndex, tiny_encoder, tmp_path: Path, snapshot_every: int, monkeypatch
) -> None:
    monkeypatch.setattr(changelog, "SNAPSHOT_EVERY", snapshot_every)
    corpus = docs(40)
    index.upsert(corpus)
    before = index.manifest["version"]
    seen: list[int] = []

    def during(done: int, total: int) -> None:
        if not seen:  # mid-rebuild: old version still answers, and a write is acknowledged
            assert index.search(vector(tiny_encoder, corpus[5].text), "", top_k=1)[0].id == "d5"
            index.upsert([Document("during", "france paris capital city river")])
            index.delete("d6")
        seen.append(done)

    manifest = index.rebuild(progress=during)
    assert seen and manifest["version"] > before == layout.current_version(tmp_path / "idx") - 1
    assert index.manifest["version"] == manifest["version"]
    assert index.get("during") is not None and index.get("d6") is None
    assert (
        index.search(vector(tiny_encoder, "france paris capital city river"), "", top_k=1)[0].id == "during"
    )
    assert index.stats() == {"documents": 40, "chunks": 40, "vectors": 40}
    reopened = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    assert reopened.stats() == index.stats() and reopened.get("during") is not None
    reopened.close()


def test_long_documents_are_chunked_and_scored_by_best_chunk(index: SearchIndex, tiny_encoder) -> None:
    filler = " ".join(["the cat sat on the mat"] * 40)
    needle = "zebra quokka"  # words only the long document has: BM25 must find it and name the right chunk
    index.upsert([Document("long", f"{filler} {needle} {filler}"), *docs(10)])
    stats = index.stats()
    assert stats["chunks"] > stats["documents"]
    hit = index.search(None, needle, top_k=1, mode="bm25")[0]
    assert hit.id == "long" and "zebra" in hit.chunk and len(hit.chunk) < len(hit.text)
    ids = [h.id for h in index.search(vector(tiny_encoder, filler), "", top_k=11)]
    assert len(ids) == len(set(ids)) == 11  # one hit per document, not per chunk


def test_concurrent_threads_do_not_share_sqlite_connections(index: SearchIndex) -> None:
    index.upsert(docs(5))
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(index.stats()["documents"])) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [5] * 8


def test_read_only_replica_writes_nothing_and_refuses_writes(
    index: SearchIndex, tiny_encoder, tmp_path
) -> None:
    """Compose mounts the index read-only into the api replicas: opening and searching must not touch it."""

    corpus = docs(20)
    index.upsert(corpus)
    index.close()  # the writer is gone, as after `cloze index build`: SQLite has checkpointed its WAL
    root = tmp_path / "idx"
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    replica = SearchIndex.open(root, tiny_encoder, read_only=True)
    target = corpus[5]
    assert (
        replica.search(vector(tiny_encoder, target.text), target.text, top_k=1, mode="hybrid")[0].id
        == target.id
    )
    assert replica.get(target.id) == target and replica.stats()["documents"] == 20
    with pytest.raises(ReadOnlyIndex):
        replica.upsert([Document("new", "some text")])
    with pytest.raises(ReadOnlyIndex):
        replica.delete(target.id)
    replica.close()
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before
    with pytest.raises(FileNotFoundError):
        SearchIndex.open(tmp_path / "empty", tiny_encoder, read_only=True)


def changelog_rows(index: SearchIndex) -> int:
    return len(index._live.store.changes_since(0))


def test_changelog_is_pruned_behind_snapshots_and_reopening_loses_nothing(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    monkeypatch.setattr(changelog, "SNAPSHOT_EVERY", 5)
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    corpus = docs(12)
    for document in corpus:
        index.upsert([document])
    index.delete("d3")
    store = index._live.store
    assert store.pruned_through() >= 10 and changelog_rows(index) < 5  # 13 changes, pruned every 5
    assert store.max_seq() == 13  # sequence numbers keep counting past the pruned rows
    index.close()
    reopened = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        assert reopened.stats() == {"documents": 11, "chunks": 11, "vectors": 11}
        for document in corpus[:3] + corpus[4:]:
            assert reopened.search(vector(tiny_encoder, document.text), "", top_k=1)[0].id == document.id
    finally:
        reopened.close()


def test_a_writer_behind_the_pruned_changelog_reloads(tmp_path: Path, tiny_encoder, monkeypatch) -> None:
    monkeypatch.setattr(changelog, "SNAPSHOT_EVERY", 3)
    first = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    second = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        for document in docs(7):
            first.upsert([document])
        assert second._live.applied_seq < first._live.store.pruned_through()
        assert second.reload_if_changed()
        assert second.stats()["vectors"] == 7
        assert second.search(vector(tiny_encoder, docs(7)[4].text), "", top_k=1)[0].id == "d4"
        assert second.search(None, docs(7)[4].text, mode="bm25", top_k=1)[0].id == "d4"
    finally:
        first.close()
        second.close()


def test_a_snapshot_older_than_the_pruned_changelog_is_rebuilt_from_the_store(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    monkeypatch.setattr(changelog, "SNAPSHOT_EVERY", 3)
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    corpus = docs(7)
    index.upsert(corpus[:1])
    index.upsert(corpus[1:3])  # third change: snapshot at 3, changelog pruned through 3
    folder = index._live.folder
    faiss_file = folder / layout.VECTORS
    files = [faiss_file, faiss_file.with_suffix(".json")]
    for path in files:
        shutil.copy(path, tmp_path / path.name)
    for document in corpus[3:]:
        index.upsert([document])
    index.close()  # snapshot at 7, pruned through 7
    for path in files:  # a FAISS snapshot older than the pruned changelog (a restored backup, a torn save)
        shutil.copy(tmp_path / path.name, path)
    reopened = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    try:
        assert reopened.stats()["vectors"] == 7
        assert reopened.search(vector(tiny_encoder, corpus[5].text), "", top_k=1)[0].id == "d5"
    finally:
        reopened.close()


def test_closing_stops_the_background_bm25_build_first(tmp_path: Path, tiny_encoder) -> None:
    """Closing a SQLite connection under the builder's running query crashed the whole process (CI segfault)."""
    writer = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    writer.upsert(docs(3000))
    folder = writer._live.folder
    writer.close()
    shutil.rmtree(folder / lexical.FOLDER)  # a version whose BM25 index is lost (or predates tantivy)
    reopened = SearchIndex.open(tmp_path / "idx", tiny_encoder)  # starts a fresh background build
    version = reopened._live
    reopened.close()
    assert version.lexical._builder is not None and not version.lexical._builder.is_alive()
    assert version.lexical.start(version.store) is None  # nothing restarts it against the closed store


def test_a_write_that_landed_is_reported_landed_when_faiss_fails_and_is_applied_later(
    index: SearchIndex, tiny_encoder, monkeypatch
) -> None:
    """SQLite commits first; a FAISS add that fails afterwards must neither lose the write nor report it
    lost: the upsert returns, and the next catch-up applies it (once: it removes before adding)."""
    index.upsert(docs(10))
    real_add, calls = VectorIndex.add, []

    def add_once_failing(self, ids, vectors):
        calls.append(len(ids))
        if len(calls) == 1:
            real_add(self, ids[:1], vectors[:1])  # half applied, then out of memory
            raise MemoryError("simulated")
        real_add(self, ids, vectors)

    monkeypatch.setattr(VectorIndex, "add", add_once_failing)
    landed = Document("landed", "queen king river paris france capital", {"kind": "landed"})
    assert index.upsert([landed]) == 1  # reported landed, not an error
    assert index.get("landed") == landed
    index.reload_if_changed()  # the service's poll: the changelog is replayed
    assert index.stats()["vectors"] == index.stats()["chunks"] == 11
    assert index.search(vector(tiny_encoder, landed.text), "", top_k=1)[0].id == "landed"
    assert filtered_ids(index, tiny_encoder, {"kind": "landed"}) == ["landed"]  # the columns caught up too


def test_a_commit_says_whether_its_write_is_searchable_yet(
    index: SearchIndex, tiny_encoder, monkeypatch
) -> None:
    """Durable is not searchable: the service answers ``searchable`` from what applying the write did."""

    def embedded(doc: Document) -> list:
        chunked = index.prepare([doc])
        return attach_vectors(chunked, tiny_encoder.embed(chunk_texts(chunked), normalize=True))

    def out_of_memory(self, ids, vectors):
        raise MemoryError("simulated")

    monkeypatch.setattr(VectorIndex, "add", out_of_memory)
    assert index.commit(embedded(Document("a", "queen river"))) == (1, False)
    assert index.get("a") is not None
    monkeypatch.undo()
    assert index.commit(embedded(Document("b", "king river"))) == (1, True)
    assert index.stats()["vectors"] == 2  # the second write's catch-up replayed the first


@pytest.mark.parametrize(
    "read",
    [
        lambda index: index.get("d0"),
        lambda index: index.stats(),
        lambda index: index.metadata_fields(),
        lambda index: pytest.raises(UnknownFilterField, index.check_filter_fields, {"colour": "blue"}),
    ],
)
def test_reads_of_the_live_version_are_never_closed_under_them(index: SearchIndex, monkeypatch, read) -> None:
    """A swap (a replica's reload, a rebuild, a restore) closes the version it replaced: a read that had taken
    that version's connection without the readers' lock then used a closed database."""
    index.upsert(docs(3))
    reading, real, swapper = threading.Event(), DocumentStore._conn, threading.current_thread()

    def slow(self):
        conn = real(self)
        if threading.current_thread() is not swapper:
            reading.set()
            time.sleep(0.3)  # the swap comes now
        return conn

    monkeypatch.setattr(DocumentStore, "_conn", slow)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(read, index)
        assert reading.wait(5)
        live = index._live
        with index._mutate:  # as ``_catch_up`` reopens a version
            index._swap(OpenVersion(index.root, live.number, live.read_only)).close(save=False)
        answer.result()  # no "Cannot operate on a closed database"


def filtered_ids(index: SearchIndex, encoder, filters: dict) -> list[str]:
    hits = index.search(vector(encoder, "queen"), "", top_k=20, mode="dense", filters=filters)
    return sorted(hit.id for hit in hits)


def test_columns_that_fail_to_follow_a_write_catch_up_on_the_replay(
    index: SearchIndex, tiny_encoder, monkeypatch
) -> None:
    """The in-memory filter columns are a derived copy as FAISS is: a failure applying a committed write to
    them is replayed (idempotently) by the next catch-up, so filters and facets see the write, and a delete."""
    index.upsert([Document(f"d{i}", "queen river", {"kind": "old", "n": i}) for i in range(3)])
    real_apply, calls = Columns.apply, []

    def apply_once_failing(self, update):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("simulated")
        real_apply(self, update)

    monkeypatch.setattr(Columns, "apply", apply_once_failing)
    assert index.upsert([Document("d1", "queen river", {"kind": "new", "n": 10})]) == 1
    index.reload_if_changed()
    assert filtered_ids(index, tiny_encoder, {"kind": "new"}) == ["d1"]
    assert filtered_ids(index, tiny_encoder, {"kind": "old"}) == ["d0", "d2"]
    assert index.delete("d2")
    facets = index.facets({"kind": "old"}, ["n"])
    assert facets["total"] == 1 and facets["fields"]["n"]["numbers"] == {"min": 0, "max": 0}


def test_a_page_of_documents_is_bounded_in_bytes_and_pages_on(index: SearchIndex) -> None:
    index.upsert([Document(f"d{i:02}", f"word{i} " * 100) for i in range(12)])  # ~700 bytes each
    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = index.list_documents(limit=1000, cursor=cursor, max_bytes=2_500)
        assert 1 <= len(page) <= 4 and sum(len(d.text) for d in page) <= 2_500 + 800
        seen += [d.id for d in page]
        pages += 1
        if cursor is None:
            break
    assert seen == [f"d{i:02}" for i in range(12)] and pages >= 3
