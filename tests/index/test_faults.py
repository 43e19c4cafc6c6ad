"""Fault handling of the index in one process (the crash suite, tests/e2e/test_crashes.py, does it to a
real server): the writer lock, idempotent replay, repairs at open, full disks, failed rebuilds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.crashes import mount_tmpfs, unmount
from index.records import Document, StorageError
from index.search_index import SearchIndex
from index.storage import layout, vectors
from tests.index.conftest import killed, opened, saved_index, tiny_documents

REPO = Path(__file__).resolve().parents[2]


def docs(count: int, seed: int = 0, prefix: str = "d") -> list[Document]:
    return [Document(f"{prefix}{i}", r["text"]) for i, r in enumerate(tiny_documents(count, seed))]


def lease_in_another_process(root: Path) -> subprocess.CompletedProcess:
    code = f"from index.storage.layout import WriterLease; WriterLease({str(root)!r}); print('got it')"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_one_writer_process_per_index(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    second = SearchIndex.open(root, tiny_encoder)  # the same process shares the lock
    second.close()
    refused = lease_in_another_process(root)
    assert refused.returncode != 0
    assert "open for writing by another process" in refused.stderr and "pid" in refused.stderr
    index.close()
    assert lease_in_another_process(root).stdout.strip() == "got it"  # released with the last writer


def test_a_crash_between_the_faiss_file_and_its_json_replays_idempotently(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    root, repairs = tmp_path / "idx", []
    saved_index(root, tiny_encoder, docs(6))  # snapshot: FAISS and JSON at the same sequence
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(docs(5, seed=1, prefix="e"))
    real = vectors.atomic_write

    def die_before_json(path: Path, data: bytes) -> None:
        if path.suffix == ".json":
            raise OSError("killed between the FAISS file and its JSON")
        real(path, data)

    monkeypatch.setattr(vectors, "atomic_write", die_before_json)
    index._live.snapshot()  # new FAISS bytes (11 vectors), old JSON (6), changelog kept
    monkeypatch.setattr(vectors, "atomic_write", real)
    killed(index)

    with opened(root, tiny_encoder, on_repair=repairs.append) as reopened:
        assert reopened.stats() == {"documents": 11, "chunks": 11, "vectors": 11}
        assert repairs == []  # no duplicate ids needed repairing: remove-before-add did it
        for document in docs(6) + docs(5, seed=1, prefix="e"):
            top = reopened.search(tiny_encoder.embed([document.text], normalize=True)[0], "", top_k=1)
            assert top[0].id == document.id


def test_damaged_snapshot_files_are_rebuilt_from_the_store(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    folder = saved_index(root, tiny_encoder, docs(8))
    for damage in ("truncate", "delete-json", "garble-json"):
        if damage == "truncate":
            data = (folder / layout.VECTORS).read_bytes()
            (folder / layout.VECTORS).write_bytes(data[: len(data) // 3])
        elif damage == "delete-json":
            (folder / "vectors.json").unlink()
        else:
            (folder / "vectors.json").write_text("{not json")
        repairs: list[str] = []
        with opened(root, tiny_encoder, on_repair=repairs.append) as reopened:
            assert repairs == ["damaged-vectors"], damage
            assert reopened.stats()["vectors"] == 8
        repairs.clear()
        SearchIndex.open(root, tiny_encoder, on_repair=repairs.append).close()
        assert repairs == []  # the repair was saved


def test_a_lost_or_garbled_pointer_serves_the_newest_complete_version(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(docs(5))
    index.rebuild()
    index.upsert([Document("late", "queen king river")])
    number = index.manifest["version"]
    index.close()
    for damage in (b"", b"\x00\xffgarbage", b"99\n"):
        if damage:
            (root / layout.POINTER).write_bytes(damage)
        else:
            (root / layout.POINTER).unlink()
        repairs: list[str] = []
        with opened(root, tiny_encoder, read_only=True, on_repair=repairs.append) as replica:
            assert replica.manifest["version"] == number and replica.get("late") is not None
        assert repairs == ["fallback-version"]
        SearchIndex.open(root, tiny_encoder, on_repair=repairs.append).close()
        assert layout.current_version(root) == number  # the writer repaired the pointer


def test_a_full_disk_refuses_writes_whole_and_the_next_write_after_space_works(
    tmp_path: Path, tiny_encoder
) -> None:
    disk = tmp_path / "disk"
    mount_tmpfs(disk, 8)
    try:
        index = SearchIndex.open(disk / "idx", tiny_encoder)
        index.upsert(docs(10))
        ballast = (disk / "ballast").open("ab", buffering=0)
        with pytest.raises(StorageError) as refused:
            for step in range(200):  # until the WAL must grow past what SQLite already holds
                before = index.stats()
                ballast_fill(ballast)
                index.upsert(docs(20, seed=step + 10, prefix=f"f{step}-"))
        assert refused.value.full and "disk is full" in str(refused.value)
        assert index.stats() == before  # nothing of the refused batch: not a document, not a vector
        ballast.close()
        (disk / "ballast").unlink()
        assert index.upsert([Document("after", "king queen paris")]) == 1
        assert index.get("after") is not None
        index.close()
        with opened(disk / "idx", tiny_encoder) as reopened:
            counts = reopened.stats()
        assert counts["vectors"] == counts["chunks"] == before["chunks"] + 1
    finally:
        unmount(disk)


def ballast_fill(handle) -> None:
    for block in (1 << 20, 1 << 12, 1 << 9):
        try:
            while True:
                handle.write(b"\1" * block)
        except OSError:
            pass


def test_a_failed_rebuild_removes_its_version_and_the_index_goes_on(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    from index.build.builder import VersionDraft

    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    index.upsert(docs(6))
    versions = layout.all_versions(tmp_path / "idx")

    def full(self, *args, **kwargs):
        raise StorageError("the disk is full", full=True)

    monkeypatch.setattr(VersionDraft, "fill", full)
    with pytest.raises(StorageError):
        index.rebuild()
    assert layout.all_versions(tmp_path / "idx") == versions
    monkeypatch.undo()
    assert index.upsert([Document("next", "cat dog mat")]) == 1
    assert index.rebuild()["documents"] == 7
    index.close()


def test_an_error_after_the_pointer_switched_still_swaps(tmp_path: Path, tiny_encoder, monkeypatch) -> None:
    """Writes after a rebuild must land on the version CURRENT names, whatever publish reported."""
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(docs(4))
    real = layout.publish

    def publish_then_fail(root_: Path, version: int) -> None:
        real(root_, version)
        raise OSError("fsync of the folder failed after the rename")

    monkeypatch.setattr(layout, "publish", publish_then_fail)
    index.rebuild()
    assert index.manifest["version"] == layout.current_version(root)
    index.upsert([Document("after", "river city capital")])
    index.close()
    with opened(root, tiny_encoder) as reopened:
        assert reopened.get("after") is not None and reopened.stats()["vectors"] == 5


def test_a_version_whose_store_is_damaged_falls_back_to_the_one_before(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(docs(5))
    index.rebuild()  # versions 1 (kept) and 2 (current)
    damaged = index.manifest["version"]
    index.close()
    (layout.version_dir(root, damaged) / layout.STORE).write_bytes(b"not a database" * 100)
    repairs: list[str] = []
    with opened(root, tiny_encoder, on_repair=repairs.append) as reopened:
        assert repairs == ["fallback-version"] and reopened.manifest["version"] == damaged - 1
        assert reopened.stats()["documents"] == 5 and layout.current_version(root) == damaged - 1
        assert reopened.upsert([Document("later", "cat dog mat")]) == 1


def test_a_killed_snapshot_leaves_no_temp_file_behind_the_next_writer(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    SearchIndex.open(root, tiny_encoder).close()
    folder = layout.version_dir(root, layout.current_version(root))
    (folder / ".vectors.faiss.4242-0000.tmp").write_bytes(b"killed mid-write")
    SearchIndex.open(root, tiny_encoder).close()
    assert not list(folder.glob(".*.tmp"))


def test_a_build_refuses_to_publish_over_writes_the_live_index_took_meanwhile(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    from index.build.builder import BuildOptions, VersionDraft, build_from_input
    from index.records import LiveWritesDuringBuild
    from tests.index.conftest import write_jsonl

    root = tmp_path / "idx"
    corpus = write_jsonl(tmp_path / "corpus.jsonl", tiny_documents(12))
    options = BuildOptions(show_progress=False)
    build_from_input(root, corpus, tiny_encoder, options)
    live = SearchIndex.open(root, tiny_encoder)
    real_fill = VersionDraft.fill

    def fill_while_the_service_writes(self, documents, progress=None):
        live.upsert([Document("acknowledged-meanwhile", "queen king paris river")])
        return real_fill(self, documents, progress)

    monkeypatch.setattr(VersionDraft, "fill", fill_while_the_service_writes)
    other = write_jsonl(tmp_path / "other.jsonl", tiny_documents(20, seed=5))
    with pytest.raises(LiveWritesDuringBuild, match="acknowledged writes while this build ran"):
        build_from_input(root, other, tiny_encoder, options)
    monkeypatch.undo()
    assert layout.current_version(root) == 1 and live.get("acknowledged-meanwhile") is not None
    live.close()
    resumed = build_from_input(root, other, tiny_encoder, BuildOptions(show_progress=False, resume=True))
    assert resumed["version"] == 2 == layout.current_version(root) and resumed["documents"] == 20


def test_a_build_does_not_publish_while_another_process_writes_the_index(
    tmp_path: Path, tiny_encoder
) -> None:
    """The writer lock is held by a live service in another process: a build's switch could lose a write
    that process acknowledges in between, so the build stays unpublished until the writer stops."""
    import subprocess
    import sys

    from index.build.builder import BuildOptions, build_from_input
    from index.records import LiveWritesDuringBuild
    from tests.index.conftest import write_jsonl

    root = tmp_path / "idx"
    build_from_input(
        root,
        write_jsonl(tmp_path / "a.jsonl", tiny_documents(8)),
        tiny_encoder,
        BuildOptions(show_progress=False),
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from index.storage.layout import WriterLease; WriterLease(sys.argv[1]); "
            "print('held', flush=True); sys.stdin.read()",
            str(root),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        other = write_jsonl(tmp_path / "b.jsonl", tiny_documents(10, seed=3))
        with pytest.raises(LiveWritesDuringBuild, match="open for writing by another process"):
            build_from_input(root, other, tiny_encoder, BuildOptions(show_progress=False))
        assert layout.current_version(root) == 1
    finally:
        holder.communicate("")
    resumed = build_from_input(root, other, tiny_encoder, BuildOptions(show_progress=False, resume=True))
    assert resumed["version"] == 2 == layout.current_version(root) and resumed["documents"] == 10
