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

Restoring one is ``index.archive.restore``: it trusts only what it checks itself (``index.archive.checks``).
"""

from __future__ import annotations

import contextlib
import errno
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
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import faiss

from index.archive.checks import (
    ARCHIVE_FORMAT,
    INFO,
    SIDECAR,
    ArchiveTooLarge,
    BadArchive,
    SnapshotError,
)
from index.archive.restore import read_info
from index.faultpoints import pause_for_tests
from index.storage import layout
from index.storage.vectors import fsync_dir
from index.storage.version import OpenVersion

log = logging.getLogger(__name__)

__all__ = ["ArchiveTooLarge", "BadArchive", "SnapshotError"]  # defined in checks, raised here
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\.tar(\.gz)?")
LOCK = ".snapshot.lock"
PARTIAL = ".partial"
BACKUP_PAGES = 4096  # SQLite pages copied per backup step (16 MB at 4 KB pages): one progress line per step
READ_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)
Compression = str  # "none" | "gzip"


class SnapshotInProgress(SnapshotError):
    """Another snapshot of this collection is being written (one at a time)."""


class SnapshotNoSpace(SnapshotError):
    """The snapshot folder's disk cannot hold the archive."""


class SnapshotNotFound(SnapshotError):
    """No snapshot of that name."""


class InvalidSnapshotName(SnapshotError, ValueError):
    """A name that is not one this module hands out (path separators, ``..``, other suffixes)."""


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
        raise SnapshotNotFound(f"no snapshot named {name!r}")
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
    except SnapshotError as exc:
        return entry | {"problem": str(exc)}
    keep = ("created", "sequence", "documents", "chunks", "vectors", "version", "model_fingerprint")
    return entry | {key: info.get(key) for key in keep}


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
            raise SnapshotInProgress("a snapshot or restore of this collection is already running") from exc
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
            f"a snapshot needs about {needed / 2**20:.1f} MiB; the snapshot folder has {free / 2**20:.1f} MiB "
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
                    f"the snapshot folder's disk filled while writing snapshot {name}"
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
