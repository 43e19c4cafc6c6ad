"""Snapshots in one process: a snapshot holds exactly the writes acknowledged before it began, restores into a
new published version by importing its rows into a store of the service's own, and every damaged or foreign
archive is refused before anything is published, with the live index untouched."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import tarfile
import threading
import time
from pathlib import Path

import pytest

from harness.archives import edited_store, hostile_archives, neutralised_archives, pack, unpack
from index.archive import restore, snapshots
from index.records import Document
from index.search_index import SearchIndex
from index.storage import layout
from index.storage.store import DocumentStore
from tests.index.conftest import tiny_documents


def docs(count: int, seed: int, prefix: str) -> list[Document]:
    return [Document(f"{prefix}{i}", r["text"], {"n": i}) for i, r in enumerate(tiny_documents(count, seed))]


def all_ids(index: SearchIndex) -> set[str]:
    page, _ = index.list_documents(limit=1000)
    return {d.id for d in page}


def assert_searchable(index: SearchIndex, documents: list[Document]) -> None:
    stats = index.stats()
    assert stats["vectors"] == stats["chunks"]
    for document in documents[:5]:
        vector = index.encoder.embed([document.text], normalize=True)[0]
        assert index.search(vector, document.text, top_k=1)[0].id == document.id


@pytest.fixture
def live(tmp_path: Path, tiny_encoder):
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    yield index
    index.close()


def test_a_snapshot_restores_exactly_the_writes_before_it(live: SearchIndex, tmp_path: Path) -> None:
    before = docs(40, 1, "before-")
    live.upsert(before)
    live.delete("before-3")
    folder = tmp_path / "snaps"
    entry = live.snapshot(folder)
    assert entry["documents"] == 39 and entry["name"].endswith(".tar")
    assert [s["name"] for s in snapshots.list_snapshots(folder)] == [entry["name"]]

    live.upsert(docs(10, 2, "after-"))
    live.delete("before-4")
    restored = live.restore(folder / entry["name"])

    assert restored["documents"] == 39 and restored["version"] == layout.current_version(live.root)
    assert all_ids(live) == {d.id for d in before} - {"before-3"}
    assert live.get("before-4") is not None and live.get("after-0") is None
    assert_searchable(live, [d for d in before if d.id != "before-3"])
    live.upsert(docs(3, 3, "later-"))  # the restored version takes writes
    assert live.get("later-0") is not None


def test_writes_during_the_copy_land_in_the_live_index_not_in_the_snapshot(
    live: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    live.upsert(docs(30, 4, "old-"))
    real_backup = snapshots._backup_store
    monkeypatch.setattr(snapshots, "BACKUP_PAGES", 1)  # hundreds of steps for writes to land between
    stop, written = threading.Event(), []

    def keep_writing() -> None:
        while not stop.is_set():
            serial = len(written)
            live.upsert([Document(f"during-{serial}", f"king queen river {serial}")])
            written.append(serial)

    def backup_while_writing(source, target, name):
        # Another thread, as the service's write pool would: the writer's lock must be free here.
        writer = threading.Thread(target=keep_writing)
        writer.start()
        while not written:
            time.sleep(0.01)
        try:
            real_backup(source, target, name)
        finally:
            stop.set()
            writer.join(timeout=30)

    monkeypatch.setattr(snapshots, "_backup_store", backup_while_writing)
    entry = live.snapshot(tmp_path / "snaps")
    assert entry["documents"] == 30 and len(written) >= 2
    assert all(live.get(f"during-{n}") is not None for n in written)
    live.restore(tmp_path / "snaps" / entry["name"])
    assert all_ids(live) == {f"old-{i}" for i in range(30)}


def test_gzip_archives_and_faiss_trailing_the_store_restore(
    live: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    live.upsert(docs(20, 6, "g-"))
    monkeypatch.setattr("index.search_index.apply_changes", lambda version, lock: 0)
    lagging = docs(6, 13, "lag-")
    live.upsert(lagging)  # committed, not in FAISS (as after an error between the commit and the catch-up)
    monkeypatch.undo()
    entry = live.snapshot(tmp_path / "snaps", compression="gzip")
    assert entry["name"].endswith(".tar.gz")
    info = restore.verify_archive(tmp_path / "snaps" / entry["name"], None, tmp_path)
    with tarfile.open(tmp_path / "snaps" / entry["name"]) as archive:
        sidecar = json.loads(archive.extractfile(snapshots.SIDECAR).read())
    assert sidecar["synced_seq"] < info["sequence"]
    live.upsert(docs(5, 7, "h-"))
    live.restore(tmp_path / "snaps" / entry["name"])
    assert len(all_ids(live)) == 26
    assert_searchable(live, lagging)


def rewrite(archive: Path, out: Path, change) -> Path:
    """A copy of ``archive`` with ``change(name, data) -> (name, data) | None`` applied to each member."""
    with tarfile.open(archive) as source, tarfile.open(out, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()
            changed = change(member.name, data)
            if changed is None:
                continue
            name, data = changed
            info = tarfile.TarInfo(name)
            info.size = len(data)
            target.addfile(info, io.BytesIO(data))
    return out


def with_info(archive: Path, out: Path, **fields) -> Path:
    def change(name, data):
        if name == snapshots.INFO:
            return name, json.dumps(json.loads(data) | fields).encode()
        return name, data

    return rewrite(archive, out, change)


def damaged_archives(good: Path, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Each kind of bad archive, with the words its refusal must contain."""
    raw = good.read_bytes()
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(raw[: len(raw) // 2])
    flipped = tmp_path / "flipped.tar"
    data = bytearray(raw)
    with tarfile.open(good) as opened:  # inside the store's bytes, not the archive's zero padding
        store = opened.getmember(layout.STORE)
        data[store.offset_data + store.size // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    not_tar = tmp_path / "notes.tar"
    not_tar.write_bytes(b"hello, not an archive" * 100)
    traversal = rewrite(
        good,
        tmp_path / "traversal.tar",
        lambda n, d: (f"../{n}", d) if n == layout.VECTORS else (n, d),
    )
    link = tmp_path / "link.tar"
    with tarfile.open(good) as source, tarfile.open(link, "w") as target:
        for member in source.getmembers():
            if member.name == layout.VECTORS:
                member = tarfile.TarInfo(layout.VECTORS)
                member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
                target.addfile(member)
            else:
                target.addfile(member, source.extractfile(member))
    return {
        "truncated": (truncated, "truncated"),
        "bit flip": (flipped, "corrupted"),
        "not a tar": (not_tar, "not a readable tar"),
        "another model": (with_info(good, tmp_path / "model.tar", model_fingerprint="0" * 16), "model"),
        "another format": (with_info(good, tmp_path / "format.tar", format=99), "format 99"),
        "path traversal": (traversal, "unexpected member '../vectors.faiss'"),
        "a link": (link, "not a regular file"),
    }


@pytest.mark.parametrize("private", [False, True], ids=["uploaded", "private"])
def test_damaged_and_foreign_archives_are_refused_and_the_live_index_is_untouched(
    live: SearchIndex, tmp_path: Path, private: bool
) -> None:
    live.upsert(docs(25, 8, "k-"))
    good = tmp_path / "snaps" / live.snapshot(tmp_path / "snaps")["name"]
    live.upsert(docs(4, 9, "m-"))
    current, versions, ids = layout.current_version(live.root), layout.all_versions(live.root), all_ids(live)
    for case, (archive, words) in damaged_archives(good, tmp_path).items():
        with pytest.raises(snapshots.BadArchive) as refused:
            live.restore(archive, private=private)  # private: the bit flip is found while extracting
        assert words in str(refused.value), (case, str(refused.value))
        assert layout.current_version(live.root) == current and layout.all_versions(live.root) == versions, (
            case
        )
        assert all_ids(live) == ids, case
    assert not (tmp_path / "passwd").exists() and not (live.root / "versions" / "vectors.faiss").exists()


def test_one_snapshot_at_a_time_retention_and_names(live: SearchIndex, tmp_path: Path) -> None:
    live.upsert(docs(5, 10, "r-"))
    folder = tmp_path / "snaps"
    with snapshots.exclusive(folder), pytest.raises(snapshots.SnapshotInProgress):
        live.snapshot(folder)
    names = [live.snapshot(folder, keep=2)["name"] for _ in range(3)]
    assert [s["name"] for s in snapshots.list_snapshots(folder)] == names[:0:-1]
    (folder / ".snapshot-x.tar.partial").write_bytes(b"half")  # a killed snapshot's temp file
    assert len(snapshots.list_snapshots(folder)) == 2
    for bad in ("../x.tar", "a/b.tar", ".hidden.tar", "x.zip", "..tar"):
        with pytest.raises(snapshots.InvalidSnapshotName):
            snapshots.path_of(folder, bad)
    with pytest.raises(snapshots.SnapshotNotFound):
        snapshots.path_of(folder, "snapshot-19700101T000000000000Z.tar")
    snapshots.delete_snapshot(folder, names[2])
    assert [s["name"] for s in snapshots.list_snapshots(folder)] == [names[1]]
    live.snapshot(folder, keep=2)
    assert not (folder / ".snapshot-x.tar.partial").exists()


def test_no_space_is_refused_before_anything_is_written(
    live: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    live.upsert(docs(5, 11, "s-"))
    folder = tmp_path / "snaps"
    free = type("Usage", (), {"free": 1000})
    monkeypatch.setattr(snapshots.shutil, "disk_usage", lambda _: free)
    with pytest.raises(snapshots.SnapshotNoSpace, match="MiB free"):
        live.snapshot(folder)
    assert sorted(p.name for p in folder.iterdir()) == [snapshots.LOCK]


def test_offline_snapshot_and_restore_into_an_empty_folder(
    live: SearchIndex, tmp_path: Path, tiny_encoder
) -> None:
    live.upsert(docs(12, 12, "o-"))
    live.close()
    entry = snapshots.snapshot_offline(live.root, tmp_path / "snaps", "none", None)
    restored = restore.restore_offline(tmp_path / "elsewhere", tmp_path / "snaps" / entry["name"])
    assert restored["documents"] == 12 and restored["version"] == 1
    moved = SearchIndex.open(tmp_path / "elsewhere", tiny_encoder, create=False)
    try:
        assert len(all_ids(moved)) == 12
        assert_searchable(moved, docs(12, 12, "o-"))
    finally:
        moved.close()


def test_an_archive_is_believed_only_where_the_restore_checked_it(
    live: SearchIndex, tmp_path: Path, monkeypatch
) -> None:
    """Each hostile archive has valid checksums (or lies before any is read); each is refused with the class
    the service maps to its status, naming what is wrong, and the live index is untouched."""
    live.upsert(docs(12, 21, "h-"))
    good = (tmp_path / "snaps" / live.snapshot(tmp_path / "snaps")["name"]).read_bytes()
    current, versions, ids = layout.current_version(live.root), layout.all_versions(live.root), all_ids(live)
    refusals = {422: snapshots.BadArchive, 413: snapshots.ArchiveTooLarge}
    for case, (body, status, words) in hostile_archives(good).items():
        path = tmp_path / "hostile.tar"
        path.write_bytes(body)
        started = time.perf_counter()
        with pytest.raises(refusals[status]) as refused:
            live.restore(path)
        assert words in str(refused.value) and str(tmp_path) not in str(refused.value), (case, refused.value)
        assert time.perf_counter() - started < 10, case  # a bomb is refused before it is decompressed
        assert layout.current_version(live.root) == current and layout.all_versions(live.root) == versions
    assert all_ids(live) == ids

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(1 << 30, 1 << 30, 1 << 20))
    (tmp_path / "good.tar").write_bytes(good)
    with pytest.raises(snapshots.ArchiveTooLarge, match="MiB free"):
        live.restore(tmp_path / "good.tar")
    monkeypatch.undo()
    assert live.restore(tmp_path / "good.tar")["documents"] == 12


def test_a_restore_never_reads_the_archives_faiss_file(live: SearchIndex, tmp_path: Path) -> None:
    """FAISS is rebuilt from the imported vectors: a FAISS file of another shape, one declaring 2^28 floats
    (1 GiB when FAISS read it) or not FAISS at all changes nothing, and the restored collection searches."""
    before = docs(12, 22, "f-")
    live.upsert(before)
    good = (tmp_path / "snaps" / live.snapshot(tmp_path / "snaps")["name"]).read_bytes()
    for case, body in neutralised_archives(good).items():
        (tmp_path / "neutral.tar").write_bytes(body)
        assert live.restore(tmp_path / "neutral.tar")["documents"] == 12, case
        assert_searchable(live, before)


def test_nothing_of_the_archives_store_survives_but_its_rows(live: SearchIndex, tmp_path: Path) -> None:
    """The restored store's schema is exactly a new store's (the archive's extra table, index, trigger and
    CHECK are gone), its state holds nothing the archive set (a replica's position, a pruning point), its
    row ids are renumbered (a chunk id at the largest integer would fail every later write), and its
    changelog continues at the archive's sequence."""
    live.upsert(docs(8, 23, "s-"))
    live.delete("s-2")
    archive = tmp_path / "snaps" / live.snapshot(tmp_path / "snaps")["name"]
    members = unpack(archive.read_bytes())
    sequence = json.loads(members[snapshots.INFO])["sequence"]

    def tamper(connection: sqlite3.Connection) -> None:
        connection.executescript(
            """
            CREATE TABLE extra(x);
            CREATE UNIQUE INDEX chunks_text ON chunks(text);
            CREATE TRIGGER spy AFTER INSERT ON chunks BEGIN DELETE FROM documents; END;
            INSERT INTO state(key, value) VALUES ('replica_position', '{"epoch": 9, "version": 9, "seq": 9}');
            UPDATE state SET value = '999999' WHERE key = 'changelog_pruned_through';
            UPDATE chunks SET id = 9223372036854775807 WHERE id = (SELECT MAX(id) FROM chunks);
            """
        )

    (tmp_path / "tampered.tar").write_bytes(
        pack(members | {layout.STORE: edited_store(members[layout.STORE], tamper)})
    )
    restored = live.restore(tmp_path / "tampered.tar")
    store = DocumentStore(layout.version_dir(live.root, restored["version"]) / layout.STORE, read_only=True)
    fresh = DocumentStore(tmp_path / "fresh.sqlite")
    try:
        schema = "SELECT type, name, sql FROM sqlite_master ORDER BY name"
        assert store.query(schema).fetchall() == fresh.query(schema).fetchall()
        assert store.get_state("replica_position") is None and store.pruned_through() == sequence
        assert store.max_seq() == sequence and not store.changes_since(0)
        assert store.query("SELECT MAX(id) FROM chunks").fetchone()[0] == 7
    finally:
        store.close()
        fresh.close()
    live.upsert([Document("after", "a text after the restore")])  # the archive's trigger would empty it
    assert len(all_ids(live)) == 8


def test_a_poll_between_a_restores_publish_and_swap_does_not_open_it_again(
    live: SearchIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service polls for versions published elsewhere; one that lands between this process's publish and
    swap must not swap in a second copy and close the one the restore just made live (readers hold it)."""
    live.upsert(docs(6, 3, "p-"))
    archive = tmp_path / "snaps" / live.snapshot(tmp_path / "snaps")["name"]
    polls: list[bool] = []
    pause = layout.pause_for_tests

    def poll_at_swap(stage: str) -> None:
        if stage == "swap":  # CURRENT names the restored version; the live one is still the old
            poller = threading.Thread(target=lambda: polls.append(live.reload_if_changed()))
            poller.start()
            poller.join(timeout=1.0)  # it opened its copy and now waits for the restore's lock
        pause(stage)

    monkeypatch.setattr(layout, "pause_for_tests", poll_at_swap)
    live.restore(archive)
    deadline = time.monotonic() + 10
    while not polls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert polls == [False]  # it saw its own version live and closed its second copy
    assert all_ids(live) == {f"p-{i}" for i in range(6)} and live.stats()["vectors"] == 6
