"""Backups of an index: a snapshot is one tar archive holding a consistent copy of the published version.

    snapshot.json   first member: format, model fingerprint and dimension, counts, sequence, sha256 per file
    manifest.json   the version's manifest
    vectors.faiss   FAISS as of ``vectors.json``'s ``synced_seq``
    vectors.json    its sidecar (factory, search parameters, tombstones, synced_seq)
    store.sqlite    the SQLite store, copied with SQLite's online backup API

Consistency: the writer's mutation lock is held only while a read transaction is opened on the store
(``frozen``) and FAISS is serialised to memory; the backup then copies the store inside that transaction,
so it holds exactly the changelog up to ``sequence`` while writes go on. FAISS may trail the store
(``synced_seq`` <= ``sequence``) only if the live copy did; the restored version then replays the copy's
changelog at open, as after a crash (nothing was pruned past ``synced_seq``).

A restore verifies everything (member names and types, sizes, checksums, format, model) before it writes
anything, then extracts into a new version folder (checking each checksum again as it writes), opens it
(FAISS must agree with the store), and publishes it atomically under the writer lock. The draft carries
the rebuild marker, so a restore killed before its switch is deleted when the next writer opens the index.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sqlite3
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import faiss

from index import layout
from index.builder import FORMAT_VERSION, REBUILD_MARKER
from index.faultpoints import pause_for_tests
from index.records import IndexError_
from index.vectors import fsync_dir
from index.version import OpenVersion

log = logging.getLogger(__name__)

ARCHIVE_FORMAT = 1
INFO = "snapshot.json"
SIDECAR = "vectors.json"
FILES = (layout.MANIFEST, SIDECAR, layout.VECTORS, layout.STORE)  # after INFO, in this order
MAX_INFO_BYTES = 1 << 20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\.tar(\.gz)?")
LOCK = ".snapshot.lock"
PARTIAL = ".partial"
BACKUP_PAGES = 4096  # SQLite pages copied per backup step (16 MB at 4 KB pages): one progress line per step
READ_CHUNK = 1 << 20
Compression = str  # "none" | "gzip"


class SnapshotError(IndexError_):
    """Base of snapshot and restore refusals; each says what is wrong."""


class SnapshotInProgress(SnapshotError):
    """Another snapshot of this collection is being written (one at a time)."""


class SnapshotNoSpace(SnapshotError):
    """The snapshot folder's disk cannot hold the archive."""


class SnapshotNotFound(SnapshotError):
    """No snapshot of that name."""


class InvalidSnapshotName(SnapshotError, ValueError):
    """A name that is not one this module hands out (path separators, ``..``, other suffixes)."""


class BadArchive(SnapshotError, ValueError):
    """A truncated, corrupted or foreign archive: nothing was written."""


@dataclass
class Frozen:
    """One instant of a version: a store connection inside a read transaction, FAISS bytes, their meta."""

    connection: sqlite3.Connection
    sequence: int
    vectors: Any  # numpy uint8 array from faiss.serialize_index
    sidecar: dict[str, Any]
    manifest: dict[str, Any]
    counts: dict[str, int]


# ---- names and the folder ---------------------------------------------------------------------------


def default_folder(root: Path) -> Path:
    """``<index>.snapshots`` beside the index: outside it, so garbage collection, a rebuild or removing the
    index never touches its backups, and a read-only mount of the index does not stop snapshots."""
    root = Path(root).resolve()
    return root.parent / f"{root.name}.snapshots"


def check_name(name: str) -> str:
    if not NAME.fullmatch(name) or ".." in name:
        raise InvalidSnapshotName(
            f"snapshot name {name[:80]!r} is not one this service makes (letters, digits, '.', '_', '-', "
            "ending .tar or .tar.gz, no path)"
        )
    return name


def path_of(folder: Path, name: str) -> Path:
    path = Path(folder) / check_name(name)
    if not path.is_file():
        raise SnapshotNotFound(f"no snapshot named {name!r} in {folder}")
    return path


def new_name(compression: Compression) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return f"snapshot-{stamp}.tar{'.gz' if compression == 'gzip' else ''}"


def list_snapshots(folder: Path) -> list[dict[str, Any]]:
    """Finished archives, newest first; a partly written one (a temp name) is never listed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir(), reverse=True):
        if path.is_file() and NAME.fullmatch(path.name):
            found.append(describe(path))
    return found


def describe(path: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": path.name, "bytes": path.stat().st_size}
    try:
        info = read_info(path)
    except BadArchive as exc:
        return entry | {"problem": str(exc)}
    keep = ("created", "sequence", "documents", "chunks", "vectors", "version", "model_fingerprint")
    return entry | {key: info.get(key) for key in keep}


def read_info(path: Path) -> dict[str, Any]:
    """The archive's ``snapshot.json`` (its first member), without reading the rest."""
    with _open_archive(path) as archive:
        return _read_info_member(archive, path)


def delete_snapshot(folder: Path, name: str) -> None:
    path = path_of(folder, name)
    path.unlink()
    fsync_dir(path.parent)


def apply_retention(folder: Path, keep: int) -> list[str]:
    """Keep the newest ``keep`` snapshots (names sort by time); delete the others."""
    names = sorted(p.name for p in Path(folder).iterdir() if p.is_file() and NAME.fullmatch(p.name))
    doomed = names[: max(0, len(names) - keep)]
    for name in doomed:
        (Path(folder) / name).unlink(missing_ok=True)
        log.info("snapshot %s deleted (retention keeps the newest %d)", name, keep)
    if doomed:
        fsync_dir(Path(folder))
    return doomed


@contextlib.contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """One snapshot at a time per collection, across processes (a ``flock`` in the snapshot folder);
    leftovers of a killed snapshot are removed once it is held."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK).open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SnapshotInProgress(
                f"a snapshot or restore of this collection is already running (snapshot folder {folder})"
            ) from exc
        try:
            for leftover in folder.glob(f".*{PARTIAL}"):  # a killed snapshot's temp files
                leftover.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# ---- taking a snapshot ------------------------------------------------------------------------------


@contextlib.contextmanager
def frozen(live: Callable[[], OpenVersion], lock: AbstractContextManager[Any]) -> Iterator[Frozen]:
    """The live version as of one changelog sequence. ``lock`` is the writer's mutation lock, held only while
    the store's read transaction starts and FAISS is serialised (writes wait a moment, never for the copy);
    ``live()`` is asked under it, so a rebuild's swap cannot slip in between."""
    connection: sqlite3.Connection | None = None
    try:
        with lock:
            version = live()
            connection = sqlite3.connect(
                f"file:{version.store.path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
            connection.execute("BEGIN")
            row = connection.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changelog'").fetchone()
            documents = connection.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            chunks = connection.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
            vectors = version.vectors
            sidecar = {
                "synced_seq": version.applied_seq,
                "factory": vectors.factory,
                "params": vectors.params,
                "tombstones": sorted(vectors.tombstones),
            }
            serialized = faiss.serialize_index(vectors.index)
            counts = {"documents": int(documents), "chunks": int(chunks), "vectors": vectors.ntotal}
            state = Frozen(
                connection, int(row[0]) if row else 0, serialized, sidecar, dict(version.manifest), counts
            )
        yield state
    finally:
        if connection is not None:
            connection.close()


def needed_bytes(version: OpenVersion) -> int:
    """What a snapshot of ``version`` takes at its peak: the staged store copy and the archive (store + FAISS)."""
    store = version.store.path
    wal = store.with_name(store.name + "-wal")
    store_bytes = store.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    faiss_path = version.folder / layout.VECTORS
    faiss_bytes = faiss_path.stat().st_size if faiss_path.exists() else 0
    return 2 * store_bytes + faiss_bytes + (1 << 20)


def check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SnapshotNoSpace(
            f"a snapshot needs about {needed / 2**20:.1f} MiB in {folder}, which has {free / 2**20:.1f} MiB "
            "free: free space, lower the retention (CLOZE_SNAPSHOT_KEEP) or set CLOZE_SNAPSHOTS_DIR elsewhere"
        )


def take_snapshot(
    live: Callable[[], OpenVersion],
    lock: AbstractContextManager[Any],
    folder: Path,
    compression: Compression = "none",
    keep: int | None = None,
) -> dict[str, Any]:
    """Write a snapshot of the live version (``live()``) into ``folder``; returns its listing entry. Searches and writes go on
    meanwhile; the archive holds every write acknowledged before this was called, none made after the
    lock was taken. ``SnapshotInProgress`` / ``SnapshotNoSpace`` before anything is written."""
    folder = Path(folder)
    with exclusive(folder):
        check_space(folder, needed_bytes(live()))
        name = new_name(compression)
        started = time.perf_counter()
        staging = folder / f".{name}.store{PARTIAL}"
        partial = folder / f".{name}{PARTIAL}"
        try:
            with frozen(live, lock) as state:
                log.info("snapshot %s: sequence %d, %s", name, state.sequence, state.counts)
                pause_for_tests(
                    "backup"
                )  # the instant is fixed, the writer's lock free, the store not copied
                _backup_store(state.connection, staging, name)
            _write_archive(partial, state, staging, compression)
            pause_for_tests("backup-written")  # complete under its temp name, not yet listed
            os.replace(partial, folder / name)
            fsync_dir(folder)
        except OSError as exc:
            if _is_no_space(exc):
                raise SnapshotNoSpace(
                    f"the disk of {folder} filled while writing snapshot {name}: {exc}"
                ) from exc
            raise
        finally:
            staging.unlink(missing_ok=True)
            partial.unlink(missing_ok=True)
        log.info("snapshot %s written in %.1f s", name, time.perf_counter() - started)
        if keep is not None:
            apply_retention(folder, keep)
        return describe(folder / name)


def _is_no_space(exc: OSError) -> bool:
    import errno

    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _backup_store(source: sqlite3.Connection, target: Path, name: str) -> None:
    """SQLite's online backup, inside ``source``'s open read transaction (so every step reads the same
    instant), in steps that log progress."""
    destination = sqlite3.connect(target)
    last = [-1]

    def report(status: int, remaining: int, total: int) -> None:
        percent = 100 * (total - remaining) // max(total, 1)
        if percent // 10 != last[0]:
            last[0] = percent // 10
            log.info("snapshot %s: store %d%% copied (%d pages)", name, percent, total)

    try:
        source.backup(destination, pages=BACKUP_PAGES, progress=report)
    finally:
        destination.close()


def _write_archive(partial: Path, state: Frozen, staged_store: Path, compression: Compression) -> None:
    """The tar under a temp name, fsync'd: ``snapshot.json`` first, then each file."""
    payloads: dict[str, Any] = {
        layout.MANIFEST: json.dumps(state.manifest, indent=2, sort_keys=True).encode(),
        SIDECAR: json.dumps(state.sidecar).encode(),
        layout.VECTORS: memoryview(state.vectors),
    }
    files = {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name, data in payloads.items()
    }
    files[layout.STORE] = {"sha256": _file_sha256(staged_store), "bytes": staged_store.stat().st_size}
    manifest = state.manifest
    info = {
        "format": ARCHIVE_FORMAT,
        "index_format": manifest.get("format"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": manifest.get("version"),
        "model_id": manifest.get("model_id"),
        "model_fingerprint": manifest.get("model_fingerprint"),
        "dimension": manifest.get("dimension"),
        "sequence": state.sequence,
        **state.counts,
        "files": files,
    }
    mode = "w:gz" if compression == "gzip" else "w"
    with partial.open("wb") as handle:
        options = {"compresslevel": 1} if compression == "gzip" else {}
        with tarfile.open(fileobj=handle, mode=mode, format=tarfile.PAX_FORMAT, **options) as archive:  # type: ignore[call-overload]
            _add_bytes(archive, INFO, json.dumps(info, indent=2, sort_keys=True).encode())
            for name, data in payloads.items():
                _add_bytes(archive, name, data)
            with staged_store.open("rb") as store:
                archive.addfile(_member(layout.STORE, staged_store.stat().st_size), store)
        handle.flush()
        os.fsync(handle.fileno())


def _member(name: str, size: int) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.size, member.mode, member.mtime = size, 0o644, int(time.time())
    return member


def _add_bytes(archive: tarfile.TarFile, name: str, data: Any) -> None:
    archive.addfile(_member(name, len(data)), io.BytesIO(data))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(READ_CHUNK):
            digest.update(block)
    return digest.hexdigest()


# ---- verifying and restoring ------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedModel:
    """What the collection restored into runs: an archive of another model is foreign."""

    fingerprint: str
    dimension: int


def verify_archive(path: Path, expected: ExpectedModel | None) -> dict[str, Any]:
    """Every check a restore makes before it writes anything; returns ``snapshot.json``. ``BadArchive``
    names the problem: not a tar, truncated, an unexpected member (a link, a path, a duplicate), a size or
    checksum that differs, another format version, another model."""
    with _open_archive(path) as archive:
        info = _read_info_member(archive, path)
        _check_compatible(info, expected)
        for member, stream in _members(archive, info):
            _copy_checked(stream, member.name, info["files"][member.name], None)
    return info


def extract_archive(path: Path, folder: Path, info: dict[str, Any]) -> None:
    """Each file into ``folder`` (a draft no reader looks at), its checksum checked again as it is written
    (the archive could have changed since it was verified); then the files are fsync'd."""
    with _open_archive(path) as archive:
        _read_info_member(archive, path)
        for member, stream in _members(archive, info):
            with (folder / member.name).open("wb") as out:
                _copy_checked(stream, member.name, info["files"][member.name], out)
    layout.fsync_tree(folder)


def _open_archive(path: Path) -> Any:
    try:
        return tarfile.open(path, "r:*")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BadArchive(f"{Path(path).name} is not a readable tar archive (.tar or .tar.gz): {exc}") from exc


def _read_info_member(archive: tarfile.TarFile, path: Path) -> dict[str, Any]:
    try:
        first = archive.next()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BadArchive(f"{Path(path).name} is truncated or not a tar archive: {exc}") from exc
    if first is None or first.name != INFO or not first.isreg():
        found = "nothing" if first is None else repr(first.name)
        raise BadArchive(
            f"{Path(path).name} is not a cloze snapshot: its first member is {found}, not {INFO}"
        )
    if first.size > MAX_INFO_BYTES:
        raise BadArchive(f"{INFO} is {first.size} bytes, over the {MAX_INFO_BYTES}-byte limit")
    try:
        stream = archive.extractfile(first)
        info = json.loads(stream.read() if stream else b"")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BadArchive(f"{INFO} in {Path(path).name} is truncated or not JSON: {exc}") from exc
    if not isinstance(info, dict) or not isinstance(info.get("files"), dict):
        raise BadArchive(f"{INFO} in {Path(path).name} has no file list")
    return info


def _check_compatible(info: dict[str, Any], expected: ExpectedModel | None) -> None:
    if info.get("format") != ARCHIVE_FORMAT:
        raise BadArchive(
            f"snapshot format {info.get('format')!r}, but this version of cloze-search reads format {ARCHIVE_FORMAT}"
        )
    if info.get("index_format") != FORMAT_VERSION:
        raise BadArchive(
            f"the snapshot holds an index of format {info.get('index_format')!r}; this version reads format "
            f"{FORMAT_VERSION}"
        )
    if sorted(info["files"]) != sorted(FILES):
        raise BadArchive(f"{INFO} lists files {sorted(info['files'])}, expected {sorted(FILES)}")
    if expected is not None and (
        info.get("model_fingerprint") != expected.fingerprint or info.get("dimension") != expected.dimension
    ):
        raise BadArchive(
            f"the snapshot was made with model {info.get('model_id')!r} (fingerprint "
            f"{info.get('model_fingerprint')}, dimension {info.get('dimension')}), but this collection runs "
            f"fingerprint {expected.fingerprint}, dimension {expected.dimension}: restore it into a service "
            "running that model"
        )


def _members(archive: tarfile.TarFile, info: dict[str, Any]) -> Iterator[tuple[tarfile.TarInfo, IO[bytes]]]:
    """The remaining members in order, each checked to be a plain file the snapshot lists, once."""
    seen: set[str] = set()
    while True:
        try:
            member = archive.next()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BadArchive(f"the archive is truncated or damaged after {sorted(seen)}: {exc}") from exc
        if member is None:
            break
        if member.name not in FILES or "/" in member.name:
            raise BadArchive(
                f"unexpected member {member.name[:100]!r} in the archive (only {', '.join(FILES)})"
            )
        if not member.isreg():
            raise BadArchive(f"member {member.name!r} is not a regular file (links and folders are refused)")
        if member.name in seen:
            raise BadArchive(f"member {member.name!r} appears twice")
        if member.size != info["files"][member.name].get("bytes"):
            raise BadArchive(
                f"{member.name} is {member.size} bytes in the archive, {INFO} says "
                f"{info['files'][member.name].get('bytes')}"
            )
        seen.add(member.name)
        stream = archive.extractfile(member)
        assert stream is not None  # a regular file always has one
        yield member, stream
    missing = sorted(set(FILES) - seen)
    if missing:
        raise BadArchive(f"the archive is truncated: {', '.join(missing)} missing")


def _copy_checked(stream: IO[bytes], name: str, expected: dict[str, Any], out: IO[bytes] | None) -> None:
    digest, size = hashlib.sha256(), 0
    try:
        while block := stream.read(READ_CHUNK):
            digest.update(block)
            size += len(block)
            if out is not None:
                out.write(block)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if out is not None and not isinstance(exc, (tarfile.TarError, EOFError)):
            raise  # a write error (a full disk) is the disk's problem, not the archive's
        raise BadArchive(f"{name} is truncated or damaged in the archive: {exc}") from exc
    if size != expected.get("bytes"):
        raise BadArchive(f"{name} is truncated: {size} bytes read, {expected.get('bytes')} expected")
    if digest.hexdigest() != expected.get("sha256"):
        raise BadArchive(
            f"{name} is corrupted: its sha256 is {digest.hexdigest()}, {INFO} says {expected.get('sha256')}"
        )
    if out is not None:
        out.flush()
        os.fsync(out.fileno())


def prepare_version(root: Path, number: int, archive: Path, info: dict[str, Any]) -> None:
    """The archive's files as version ``number``, unpublished and marked as a draft to discard if this
    process dies: the manifest renumbered and told where it came from."""
    folder = layout.version_dir(root, number)
    folder.mkdir(parents=True)
    (folder / REBUILD_MARKER).touch()
    manifest_path = folder / layout.MANIFEST
    extract_archive(archive, folder, info)
    manifest = json.loads(manifest_path.read_text())
    manifest_path.unlink()  # written back last, renumbered: the version is complete only then
    manifest |= {
        "version": number,
        "restored_from": {"sequence": info.get("sequence"), "created": info.get("created")},
    }
    layout.write_manifest(folder, manifest)


def check_restored(version: OpenVersion, info: dict[str, Any]) -> None:
    """The opened copy must hold what the archive says it holds (FAISS agrees with the store after the
    replay at open: ``OpenVersion`` repairs a disagreement from the store's vectors)."""
    counts = version.store.counts()
    if counts["documents"] != info.get("documents") or counts["chunks"] != info.get("chunks"):
        raise BadArchive(
            f"the restored store holds {counts}, the snapshot says {info.get('documents')} documents"
        )
    version.verify()


def restore_offline(root: Path, archive: Path) -> dict[str, Any]:
    """``cloze index restore`` without a service: takes the writer lock (``IndexLocked`` naming the holder
    while a service writes the index), verifies, extracts into a new version and publishes it."""
    root = Path(root)
    lease = layout.WriterLease(root)
    try:
        with layout.build_lock(root):
            current = layout.current_version(root)
            manifest = layout.read_manifest_safely(layout.version_dir(root, current)) if current else None
            expected = (
                ExpectedModel(manifest["model_fingerprint"], int(manifest["dimension"])) if manifest else None
            )
            info = verify_archive(archive, expected)
            number = layout.next_version(root)
            try:
                prepare_version(root, number, archive, info)
                version = OpenVersion(root, number)
                try:
                    check_restored(version, info)
                finally:
                    version.close(save=True)
                pause_for_tests("restore")
                layout.publish(root, number)
            except BaseException:
                if layout.current_version(root) != number:
                    layout.remove_version(root, number)
                raise
        return {"version": number, **{k: info.get(k) for k in ("sequence", "documents", "chunks")}}
    finally:
        lease.release()


def snapshot_offline(root: Path, folder: Path, compression: Compression, keep: int | None) -> dict[str, Any]:
    """``cloze index snapshot`` without a service: the writer lock (no write can happen), then as live."""
    root = Path(root)
    lease = layout.WriterLease(root)
    try:
        current = layout.current_version(root)
        if current is None:
            raise FileNotFoundError(f"no published index in {root}")
        version = OpenVersion(root, current)
        try:
            return take_snapshot(lambda: version, contextlib.nullcontext(), folder, compression, keep)
        finally:
            version.close(save=False)
    finally:
        lease.release()
