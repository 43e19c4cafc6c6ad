"""The index directory: immutable-once-published versions, a pointer, a manifest, a build lock.

    root/CURRENT                   the published version number (switched with os.replace)
    root/versions/<n>/store.sqlite documents, chunks, vectors, FTS5 (source of truth)
    root/versions/<n>/vectors.faiss + vectors.json
    root/versions/<n>/manifest.json written last: a version without it is unfinished

A build writes a new ``versions/<n>`` that no reader looks at, fsyncs it, and only then replaces
``CURRENT``. A crash at any point leaves ``CURRENT`` naming the previous, complete version; the
unfinished directory is either resumed (``--resume``) or garbage-collected.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from index.vectors import atomic_write, fsync_dir

POINTER = "CURRENT"
MANIFEST = "manifest.json"
STORE = "store.sqlite"
VECTORS = "vectors.faiss"
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
    except (FileNotFoundError, ValueError):
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
    _pause_for_tests("publish")
    atomic_write(Path(root) / POINTER, f"{version}\n".encode())
    collect_garbage(root)


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


def _pause_for_tests(stage: str) -> None:
    """Crash-safety tests need to SIGKILL a build at a known instant: with ``CLOZE_INDEX_PAUSE_AT=<stage>``
    the builder announces itself in ``CLOZE_INDEX_PAUSE_FILE`` and waits there. A no-op otherwise."""
    if os.environ.get("CLOZE_INDEX_PAUSE_AT") != stage:
        return
    import time

    marker = os.environ.get("CLOZE_INDEX_PAUSE_FILE")
    if marker:
        Path(marker).write_text(stage)
    time.sleep(float(os.environ.get("CLOZE_INDEX_PAUSE_SECONDS", "60")))


pause_for_tests = _pause_for_tests
