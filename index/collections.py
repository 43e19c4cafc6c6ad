"""Collections: named index folders under one data root, each built with one named model.

    <root>/<name>/collection.json       name, model, options, created, incarnation: written last, so it marks a whole one
    <root>/<name>/CURRENT, versions/    an ordinary index folder (``index.storage.layout``)
    <root>/.creating-<name>-<token>/    a create in progress: renamed to <name> once whole
    <root>/.deleting-<name>-<token>/    a delete in progress: renamed away first, then removed
    <root>/.collections.lock            flock'd while a create, a delete or the clean-up runs

A create builds the collection in a staging folder and renames it into place; a delete renames it out of
place before removing a file. Both renames are atomic, so a SIGKILL at any instant leaves a folder that is
either a whole collection or a staging folder nobody reads, which ``clean_leftovers`` removes. The service's
own index (``CLOZE_INDEX``) is the collection ``default``; it lives where it always did and is not managed here
(the service describes it with a ``CollectionInfo`` of its own, ``app.service.collections.default_info``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from index.build.builder import BuildOptions, create_empty_version
from index.build.own_vectors import OwnVectors
from index.faultpoints import pause_for_tests
from index.records import collection_name_problem
from index.storage import layout
from index.storage.factories import check_factory_string, probe_shape, probe_training_size
from index.storage.vectors import VectorIndex, atomic_write, fsync_dir
from index.text.chunking import Chunker, overlap_problem

log = logging.getLogger(__name__)

DEFAULT_COLLECTION = "default"
COLLECTION_FILE = "collection.json"
LOCK_FILE = ".collections.lock"
STAGING_PREFIXES = (".creating-", ".deleting-")


class CollectionError(ValueError):
    """A request about collections that cannot be met; ``status`` is the HTTP answer that fits."""

    def __init__(self, message: str, status: int = 422, field: str = "name"):
        super().__init__(message)
        self.status, self.field = status, field


@dataclass
class CollectionInfo:
    name: str
    model: str | None  # the named model (``CLOZE_MODELS``) its vectors come from; None: the caller's own
    factory: str | None = None  # FAISS factory for its builds (None: chosen by corpus size)
    chunk_window: int | None = None  # tokens per chunk (None: the model's window)
    chunk_overlap: int | None = None  # tokens shared by neighbouring chunks (None: a quarter of the window)
    # None only for the service's own index (``default``), which has no collection.json
    created: str | None = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    dimension: int | None = None  # set (and model None): vectors its callers supply, one per document
    metric: str | None = None  # with ``dimension``: cosine or dot (``index.build.own_vectors``)
    # Set when the collection is made: one deleted and made again under its name is another (None: made
    # before incarnations were recorded).
    incarnation: str | None = None

    def own_vectors(self) -> OwnVectors | None:
        """What stands for the encoder of a collection of the caller's own vectors; None for a model's."""
        return None if self.dimension is None else OwnVectors(self.dimension, self.metric or "cosine")

    def build_options(self, **overrides: Any) -> BuildOptions:
        return BuildOptions(
            factory=self.factory, window=self.chunk_window, overlap=self.chunk_overlap, **overrides
        )


def check_name(name: str) -> None:
    if problem := collection_name_problem(name):
        raise CollectionError(f"name: {name!r} is not a collection name: {problem}")


def folder_of(root: Path, name: str) -> Path:
    check_name(name)
    return Path(root) / name


def read_info(folder: Path) -> CollectionInfo | None:
    """The collection a folder holds, or None for anything that is not a whole collection."""
    try:
        data = json.loads((Path(folder) / COLLECTION_FILE).read_text())
        info = CollectionInfo(**data)
    except (OSError, ValueError, TypeError):
        return None
    return info if info.name == Path(folder).name and collection_name_problem(info.name) is None else None


def list_collections(root: Path) -> list[CollectionInfo]:
    """Every whole collection under ``root``, by name; staging folders and strays are not collections."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [read_info(child) for child in sorted(root.iterdir()) if child.is_dir()]
    return [info for info in found if info is not None]


@contextmanager
def collections_lock(root: Path, wait: bool = True) -> Iterator[bool]:
    """The data root's lock: one create, delete or clean-up at a time across processes. Yields whether it
    was taken (``wait=False`` yields False at once when another process holds it)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_collection(root: Path, info: CollectionInfo, encoder: Any) -> Path:
    """A new, empty collection, published whole or not at all. 409 when the name is taken."""
    root = Path(root)
    target = folder_of(root, info.name)
    check_factory(info.factory, encoder.dimension)
    check_chunking(info, encoder)
    if (
        info.dimension is not None
        and info.factory
        and VectorIndex.create(info.factory, info.dimension).needs_training
    ):
        raise CollectionError(
            f"factory: {info.factory!r} needs training, which happens at a rebuild; a collection of your own "
            "vectors is never rebuilt (nothing re-embeds them): use a Flat or HNSW factory",
            422,
            "factory",
        )
    info.incarnation = info.incarnation or secrets.token_hex(8)
    with collections_lock(root):
        if target.exists():
            raise CollectionError(f"name: a collection named {info.name!r} exists", 409)
        staging = root / f".creating-{info.name}-{secrets.token_hex(4)}"
        try:
            staging.mkdir()
            create_empty_version(staging, encoder, info.build_options(show_progress=False))
            pause_for_tests("collection-create")
            atomic_write(staging / COLLECTION_FILE, json.dumps(asdict(info), indent=2).encode())
            os.rename(staging, target)
            fsync_dir(root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    log.info("collection %r created (%s)", info.name, info.model or f"own vectors of {info.dimension}")
    return target


def check_factory(factory: str | None, dimension: int) -> None:
    """A factory within the grammar (``index.storage.factories``) that takes a probe add and search at toy size:
    422 naming ``factory`` otherwise, before anything is written."""
    if factory is None:
        return
    try:
        check_factory_string(factory, dimension)
        probe = VectorIndex.create(probe_shape(factory), dimension)
        sample = np.random.default_rng(0).standard_normal(
            (probe_training_size(factory), dimension), np.float32
        )
        sample /= np.linalg.norm(sample, axis=1, keepdims=True)
        probe.train(sample)
        probe.add(np.arange(2, dtype=np.int64), sample[:2])
        probe.remove([0])
        probe.search(sample[1], 1)
    except (RuntimeError, ValueError, MemoryError) as exc:
        first_line = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise CollectionError(f"factory: {first_line}", 422, "factory") from exc


def check_chunking(info: CollectionInfo, encoder: Any) -> None:
    """The chunk shape rule (``chunking.overlap_problem``), against the window the collection will use."""
    if info.chunk_overlap is None:
        return
    window = Chunker.for_encoder(encoder, 0, info.chunk_window).window
    if problem := overlap_problem(window, info.chunk_overlap):
        raise CollectionError(f"chunk_overlap: {problem}", 422, "chunk_overlap")


def delete_collection(root: Path, name: str) -> None:
    """Remove a collection: out of place first (atomic), then its files. 404 when there is none."""
    root = Path(root)
    target = folder_of(root, name)
    with collections_lock(root):
        if read_info(target) is None:
            raise CollectionError(f"no collection named {name!r}", 404)
        doomed = root / f".deleting-{name}-{secrets.token_hex(4)}"
        os.rename(target, doomed)
        fsync_dir(root)
        pause_for_tests("collection-delete")
        shutil.rmtree(doomed)
    log.info("collection %r deleted", name)


def clean_leftovers(root: Path) -> list[str]:
    """Remove what a killed create or delete left (staging folders); skipped while another process holds
    the lock (its create may be under way). Returns the folders removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    with collections_lock(root, wait=False) as taken:
        if not taken:
            return []
        for child in root.iterdir():
            if child.is_dir() and child.name.startswith(STAGING_PREFIXES):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
    if removed:
        log.warning("removed what an interrupted create or delete left: %s", ", ".join(removed))
    return removed


def disk_usage(folder: Path) -> int:
    """Bytes on disk under ``folder`` (a collection's versions, store and vectors)."""
    total = 0
    for path in Path(folder).rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:  # removed while counted (garbage collection of an old version)
            continue
    return total


def last_write(folder: Path) -> str | None:
    """When the collection last changed: its newest version's store (WAL included)."""
    number = layout.current_version(folder)
    if number is None:
        return None
    version = layout.version_dir(folder, number)
    times = [path.stat().st_mtime for path in version.glob(f"{layout.STORE}*") if path.is_file()]
    if not times:
        return None
    return datetime.fromtimestamp(max(times), timezone.utc).isoformat(timespec="seconds")
