"""The index directory: immutable-once-published versions, a pointer, a manifest, the locks.

    root/CURRENT                   the published version number (switched with os.replace)
    root/.writer.lock              flock'd by the one process that writes the index (``WriterLease``)
    root/.build.lock               flock'd by the one build or rebuild running
    root/versions/<n>/store.sqlite documents, chunks, vectors, FTS5 (source of truth)
    root/versions/<n>/vectors.faiss + vectors.json
    root/versions/<n>/columns.json + columns/<seq>-<id>/*.npy   the filter columns (``index.storage.columns``)
    root/versions/<n>/manifest.json written last: a version without it is unfinished
    root/versions/<n>/PUBLISHED    written (fsync'd) when the version is chosen to serve, before CURRENT moves

A build writes a new ``versions/<n>`` that no reader looks at, fsyncs it, and only then replaces
``CURRENT``. A crash at any point leaves ``CURRENT`` naming the previous, complete version; the
unfinished directory is either resumed (``--resume``) or garbage-collected. A ``CURRENT`` that is lost,
garbled or names an incomplete version is reported by ``pointer_problem`` (``SearchIndex.open`` then
serves the newest *published* version, ``repair_candidates``, and a writer repairs the pointer with
``point_to``). Complete is not enough: ``cloze index build`` leaves a finished version it refused to
publish (the live index took writes meanwhile) above ``CURRENT`` for ``--resume``; serving it after a
lost pointer would hide every write acknowledged into the published one. So publication is recorded in
the version folder itself (``PUBLISHED``), and repairs and garbage collection go by it. Indexes made before
the marker existed: a writer marks the version ``CURRENT`` names when it opens it; with no marker
anywhere (an old index whose pointer was lost before any writer opened it) the newest complete version
serves, as before.
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
from index.storage.store import fsync_file
from index.storage.vectors import atomic_write, fsync_dir

FORMAT_VERSION = 1  # of the manifest and the version folder
REBUILD_MARKER = ".rebuild"  # in a version folder a service rebuild made (discarded if never published)

log = logging.getLogger(__name__)

POINTER = "CURRENT"
MANIFEST = "manifest.json"
PUBLISHED = "PUBLISHED"
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


def is_marked_published(root: Path, version: int) -> bool:
    return (version_dir(root, version) / PUBLISHED).is_file()


def mark_published(root: Path, version: int) -> None:
    """Durably record that ``version`` was chosen to serve (the caller holds the writer lock)."""
    atomic_write(version_dir(root, version) / PUBLISHED, f"{version}\n".encode())


def published_versions(root: Path) -> list[int]:
    """Complete versions that were published, oldest first: those with the marker, and those older than the
    oldest marked one (made before the marker existed). Without any marker: every version up to a readable
    ``CURRENT`` (an index from before the marker)."""
    finished = finished_versions(root)
    marked = [v for v in finished if is_marked_published(root, v)]
    if marked:
        return [v for v in finished if v in marked or v < marked[0]]
    current = current_version(root)
    return [v for v in finished if current is not None and v <= current]


def repair_candidates(root: Path) -> list[int]:
    """What a lost, garbled or dangling ``CURRENT`` may be repaired to, best first: published versions,
    newest first, never a finished version above the newest published one (a build refused publication,
    kept for ``--resume``). An index with no marker at all falls back to every complete version."""
    finished = finished_versions(root)
    marked = [v for v in finished if is_marked_published(root, v)]
    if not marked:
        return list(reversed(finished))
    return [v for v in reversed(finished) if v <= marked[-1]]


def settle_publication(root: Path, current: int) -> None:
    """Run by the writer once it serves ``current`` (followed or repaired ``CURRENT``): that version is
    marked published (an index from before the marker), and a marker above it is withdrawn (a publish
    killed between its marker and the switch: this writer now takes writes into ``current``, so that
    version must never be preferred to it)."""
    if not is_marked_published(root, current):
        mark_published(root, current)
    for version in all_versions(root):
        if version > current and is_marked_published(root, version):
            log.warning("version %s was marked published but never served: withdrawing the mark", version)
            (version_dir(root, version) / PUBLISHED).unlink(missing_ok=True)
            fsync_dir(version_dir(root, version))


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
            fsync_file(path)
    fsync_dir(folder)
    fsync_dir(folder.parent)


def publish(root: Path, version: int) -> None:
    """Make ``version`` the one readers open: everything durable first, then one atomic rename."""
    folder = version_dir(root, version)
    if read_manifest(folder) is None:
        raise RuntimeError(f"refusing to publish unfinished version {folder}")
    fsync_tree(folder)
    mark_published(root, version)  # durable before CURRENT names it: a lost pointer's repair looks for it
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
    """Below the current version keep the last ``KEEP_VERSIONS`` published ones; delete the rest, including
    drafts that were never published (a build refused publication, now superseded: ``--resume`` only
    continues drafts above ``CURRENT``). Versions above ``CURRENT`` are never touched here."""
    current = current_version(root)
    if current is None:
        return []
    published = [v for v in published_versions(root) if v <= current]
    keep = set(published[-KEEP_VERSIONS:]) | {current}
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
