"""The index directory: immutable-once-published versions, a pointer, a manifest, the locks.

    root/CURRENT                   the published version number (switched with os.replace)
    root/.writer.lock              flock'd by the one process that writes the index (``WriterLease``)
    root/.build.lock               flock'd by the one build or rebuild running
    root/versions/<n>/store.sqlite documents, chunks, vectors, FTS5 (source of truth)
    root/versions/<n>/vectors.faiss + vectors.json
    root/versions/<n>/manifest.json written last: a version without it is unfinished

A build writes a new ``versions/<n>`` that no reader looks at, fsyncs it, and only then replaces
``CURRENT``. A crash at any point leaves ``CURRENT`` naming the previous, complete version; the
unfinished directory is either resumed (``--resume``) or garbage-collected. A ``CURRENT`` that is lost,
garbled or names an incomplete version is reported by ``pointer_problem`` (``SearchIndex.open`` then
serves the newest complete version and a writer repairs the pointer with ``point_to``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from index.faultpoints import pause_for_tests
from index.records import IndexLocked
from index.vectors import atomic_write, fsync_dir

log = logging.getLogger(__name__)

POINTER = "CURRENT"
MANIFEST = "manifest.json"
STORE = "store.sqlite"
VECTORS = "vectors.faiss"
WRITER_LOCK = ".writer.lock"
KEEP_VERSIONS = 2  # the current one and the one before (a reader may still have it open)


class BuildInProgress(RuntimeError):
    """Another process holds the build lock of this index directory."""


def versions_dir(root: Path) -> Path:
    return Path(root) / "versions"


def version_dir(root: Path, version: int) -> Path:
    return versions_dir(root) / str(version)


def current_version(root: Path) -> int | None:
    try:
        return int((Path(root) / POINTER).read_text().strip())
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None


def finished_versions(root: Path) -> list[int]:
    """Versions with a manifest (complete on disk), oldest first."""
    return [v for v in all_versions(root) if (version_dir(root, v) / MANIFEST).is_file()]


def pointer_problem(root: Path) -> str | None:
    """Why ``CURRENT`` cannot be followed (missing, garbled, naming a version that is not complete), or
    None when it can, or when nothing was ever published."""
    path = Path(root) / POINTER
    if not path.exists():
        return f"{path} is missing" if finished_versions(root) else None
    number = current_version(root)
    if number is None:
        return f"{path} is garbled"
    if read_manifest_safely(version_dir(root, number)) is None:
        return f"{path} names version {number}, which is missing or has no readable manifest"
    return None


def read_manifest_safely(folder: Path) -> dict[str, Any] | None:
    try:
        return read_manifest(folder)
    except (OSError, ValueError):
        return None


def all_versions(root: Path) -> list[int]:
    folder = versions_dir(root)
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def next_version(root: Path) -> int:
    return max([0, *all_versions(root), current_version(root) or 0]) + 1


def read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    atomic_write(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())


def fsync_tree(folder: Path) -> None:
    """Flush every file and the directory itself, so a published version survives power loss."""
    for path in folder.iterdir():
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    fsync_dir(folder)
    fsync_dir(folder.parent)


def publish(root: Path, version: int) -> None:
    """Make ``version`` the one readers open: everything durable first, then one atomic rename."""
    folder = version_dir(root, version)
    if read_manifest(folder) is None:
        raise RuntimeError(f"refusing to publish unfinished version {folder}")
    fsync_tree(folder)
    pause_for_tests("publish")
    point_to(root, version)
    try:  # the version is published; failing to delete old ones must not make the caller think otherwise
        collect_garbage(root)
    except OSError as exc:
        log.warning("published version %s, but could not delete older versions: %s", version, exc)


def point_to(root: Path, version: int) -> None:
    """Switch ``CURRENT`` (one atomic rename); also how a lost or garbled pointer is repaired."""
    atomic_write(Path(root) / POINTER, f"{version}\n".encode())


def collect_garbage(root: Path) -> list[int]:
    """Delete published versions older than the last ``KEEP_VERSIONS`` and unfinished ones below the current."""
    current = current_version(root)
    if current is None:
        return []
    finished = [v for v in all_versions(root) if v <= current and read_manifest(version_dir(root, v))]
    keep = set(finished[-KEEP_VERSIONS:]) | {current}
    doomed = [v for v in all_versions(root) if v < current and v not in keep]
    for version in doomed:
        shutil.rmtree(version_dir(root, version), ignore_errors=True)
    return doomed


class WriterLease:
    """This process may change the index at ``root``: an exclusive ``flock`` on ``root/.writer.lock``,
    held for the writer's lifetime and dropped by the kernel if the process dies (no stale locks).

    Counted per process, so several ``SearchIndex`` objects of one process share it (tests, a CLI run
    in-process); across processes it is exclusive. Readers (read-only replicas) never take it."""

    _held: dict[str, list[Any]] = {}  # realpath -> [file, count]
    _guard = threading.Lock()

    def __init__(self, root: Path):
        self.key = os.path.realpath(root)
        self.released = False
        with self._guard:
            entry = self._held.get(self.key)
            if entry is None:
                entry = [self._acquire(Path(root)), 0]
                self._held[self.key] = entry
            entry[1] += 1

    @staticmethod
    def _acquire(root: Path) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        handle = (root / WRITER_LOCK).open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise IndexLocked(
                f"index {root} is open for writing by another process ({holder}); one process writes an "
                "index: send writes to that service, stop it first, or open this one read-only "
                "(CLOZE_INDEX_READ_ONLY=true)"
            ) from exc
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        return handle

    def release(self) -> None:
        with self._guard:
            if self.released:
                return
            self.released = True
            entry = self._held[self.key]
            entry[1] -= 1
            if entry[1] == 0:
                del self._held[self.key]
                fcntl.flock(entry[0].fileno(), fcntl.LOCK_UN)
                entry[0].close()


def try_build_lock(root: Path) -> Any:
    """The build lock if it is free right now (its open file: close it to release), else None."""
    handle = (Path(root) / ".build.lock").open("a")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def remove_version(root: Path, version: int) -> None:
    shutil.rmtree(version_dir(root, version), ignore_errors=True)


@contextmanager
def build_lock(root: Path) -> Iterator[None]:
    """One builder per index directory (CLI builds, service rebuilds); readers never take it."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with (Path(root) / ".build.lock").open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise BuildInProgress(f"another build is running on {root}") from exc
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
