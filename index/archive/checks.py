"""What a restore checks itself before it believes an archive: the archive's own ``snapshot.json`` is a claim,
not a fact (whoever holds a write key can recompute its checksums).

- ``snapshot.json``: an object of known fields, each of its type, every declared size within its bound;
- expansion: the declared sizes together within ``MAX_EXPANSION_RATIO`` times the archive's bytes (and an
  absolute cap) and within the target disk's free space, checked before a member is read; while reading,
  the decompressed bytes are counted and the read stops as soon as they pass what was declared;
- ``manifest.json``: an object of this index format, made with the target collection's model (fingerprint
  and dimension), its factory and chunk shape within the grammar;
- ``vectors.json``: synced sequence, factory, search parameters and tombstones typed and bounded;
- ``vectors.faiss``: its checksum only: FAISS is rebuilt from the imported vectors; only a replica's own base
  has it read, its lists adopted or its training reused once checked (``importer.rebuild_vectors``);
- ``store.sqlite``: never trusted as a file: its rows are imported one by one (``importer``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import IO, Any

from index.records import IndexError_
from index.storage import layout
from index.storage.factories import InvalidFactory, check_factory_string, check_search_params
from index.storage.layout import FORMAT_VERSION
from index.text.chunking import overlap_problem

ARCHIVE_FORMAT = 1
INFO = "snapshot.json"
SIDECAR = "vectors.json"
FILES = (layout.MANIFEST, SIDECAR, layout.VECTORS, layout.STORE)  # after INFO, in this order
MAX_INFO_BYTES = 1 << 20
# Each member's largest declared size: the JSON ones are small by construction (a tombstone list is at most
# ~12 bytes per vector); FAISS and the store are bounded by the expansion rule below.
MAX_MEMBER_BYTES = {layout.MANIFEST: 1 << 20, SIDECAR: 256 << 20}
MAX_EXPANSION_RATIO = 20  # float vectors compress ~1.1x, text ~3-4x: 20x is only a decompression bomb
EXPANSION_FLOOR = 64 << 20  # small archives may expand this far whatever their ratio (an empty store's pages)
MAX_RESTORED_BYTES = 1 << 40
TAR_OVERHEAD = 1 << 20  # headers and padding around five members, with room for PAX records
FREE_SPACE_MARGIN = 64 << 20
IMPORT_FACTOR = 2  # the extracted files and the store (and FAISS) imported from them, side by side
MAX_COUNT = 1 << 40
SHA256 = re.compile(r"[0-9a-f]{64}")


class SnapshotError(IndexError_):
    """Base of snapshot and restore refusals; each says what is wrong."""


class BadArchive(SnapshotError, ValueError):
    """A truncated, corrupted, foreign or inconsistent archive: nothing was published."""


class ArchiveTooLarge(SnapshotError):
    """An archive that would expand past its bounds or the disk's free space: nothing was published."""


def check_info(info: Any) -> dict[str, Any]:
    """``snapshot.json`` as this module reads it: fields of the right types, sizes within bounds."""
    if not isinstance(info, dict):
        raise BadArchive(f"{INFO} is {type(info).__name__}, not an object")
    files = info.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(FILES):
        listed = sorted(map(str, files))[:8] if isinstance(files, dict) else type(files).__name__
        raise BadArchive(f"{INFO} lists files {listed}, expected {sorted(FILES)}")
    for name, entry in files.items():
        if not isinstance(entry, dict):
            raise BadArchive(f"{INFO}: the entry of {name} is {type(entry).__name__}, not an object")
        _count(entry.get("bytes"), f"{INFO}: {name} bytes", MAX_MEMBER_BYTES.get(name, MAX_RESTORED_BYTES))
        if not isinstance(entry.get("sha256"), str) or not SHA256.fullmatch(entry["sha256"]):
            raise BadArchive(f"{INFO}: the sha256 of {name} is not 64 hexadecimal digits")
    for name in ("sequence", "documents", "chunks", "vectors"):
        _count(info.get(name), f"{INFO}: {name}", MAX_COUNT)
    _count(info.get("dimension"), f"{INFO}: dimension", 1 << 16)
    return info


def _count(value: Any, what: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise BadArchive(f"{what} is {str(value)[:40]!r}: an integer in 0..{most}")
    return value


def declared_bytes(info: dict[str, Any]) -> int:
    return sum(int(entry["bytes"]) for entry in info["files"].values())


def check_expansion(info: dict[str, Any], archive_bytes: int, target: Path) -> int:
    """The archive's declared contents against the bounds and the target's disk; returns the bytes a reader
    of the whole archive may decompress."""
    declared = declared_bytes(info)
    allowed = min(max(EXPANSION_FLOOR, MAX_EXPANSION_RATIO * archive_bytes), MAX_RESTORED_BYTES)
    if declared > allowed:
        raise ArchiveTooLarge(
            f"the archive declares {declared} bytes of contents from {archive_bytes} archive bytes, over "
            f"the {allowed}-byte bound ({MAX_EXPANSION_RATIO}x the archive, at least {EXPANSION_FLOOR})"
        )
    existing = next(folder for folder in (target, *target.parents) if folder.exists())  # a new index's
    free = shutil.disk_usage(existing).free
    if IMPORT_FACTOR * declared + FREE_SPACE_MARGIN > free:
        raise ArchiveTooLarge(
            f"the archive expands to {declared / 2**20:.1f} MiB and its import needs as much again; the "
            f"collection's disk has {free / 2**20:.1f} MiB free: free space first"
        )
    return declared + TAR_OVERHEAD + MAX_INFO_BYTES


class BoundedReader:
    """A read-only stream that counts what it hands out and refuses (``ArchiveTooLarge``) past ``limit``:
    tar headers, PAX records and members all come through it, so nothing decompresses past the bound."""

    def __init__(self, raw: IO[bytes], limit: int):
        self.raw, self.limit, self.count = raw, limit, 0

    def read(self, size: int = -1) -> bytes:
        room = self.limit - self.count
        want = room + 1 if size is None or size < 0 else min(size, room + 1)
        data = self.raw.read(want)
        self.count += len(data)
        if self.count > self.limit:
            raise ArchiveTooLarge(f"the archive expands past {self.limit} bytes, more than it declares")
        return data

    def close(self) -> None:
        self.raw.close()


def check_manifest(
    manifest: Any, info: dict[str, Any], fingerprint: str | None, dimension: int | None
) -> None:
    """The version's manifest: this index format, the target's model, its build options in bounds."""
    if not isinstance(manifest, dict):
        raise BadArchive(f"{layout.MANIFEST} is {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT_VERSION:
        raise BadArchive(f"{layout.MANIFEST} is of index format {str(manifest.get('format'))[:20]!r}")
    model = (manifest.get("model_fingerprint"), manifest.get("dimension"))
    if model != (info.get("model_fingerprint"), info.get("dimension")):
        raise BadArchive(f"{layout.MANIFEST} and {INFO} name different models")
    if fingerprint is not None and model != (fingerprint, dimension):
        raise BadArchive(
            f"the snapshot was made with model {str(manifest.get('model_id'))[:80]!r} (fingerprint "
            f"{str(model[0])[:40]}, dimension {str(model[1])[:10]}), but this collection runs fingerprint "
            f"{fingerprint}, dimension {dimension}: restore it into a collection of that model"
        )
    dims = _count(model[1], f"{layout.MANIFEST}: dimension", 1 << 16)
    build = manifest.get("build", {})
    if not isinstance(build, dict):
        raise BadArchive(f"{layout.MANIFEST}: build is {type(build).__name__}, not an object")
    try:
        for factory in (manifest.get("factory"), build.get("factory")):
            if factory is not None:
                check_factory_string(factory, dims)
    except InvalidFactory as exc:
        raise BadArchive(f"{layout.MANIFEST}: factory {exc}") from exc
    window, overlap = build.get("chunk_window"), build.get("chunk_overlap")
    if window is not None or overlap is not None:
        window, overlap = (
            _count(value, f"{layout.MANIFEST}: {name}", 1 << 16)
            for value, name in ((window, "chunk_window"), (overlap, "chunk_overlap"))
        )
        if problem := overlap_problem(window, overlap):
            raise BadArchive(f"{layout.MANIFEST}: {problem}")


def check_sidecar(sidecar: Any, info: dict[str, Any], dimension: int) -> str:
    """``vectors.json``: returns its factory. Tombstones must be distinct chunk ids, fewer than the vectors."""
    if not isinstance(sidecar, dict):
        raise BadArchive(f"{SIDECAR} is {type(sidecar).__name__}, not an object")
    _count(sidecar.get("synced_seq"), f"{SIDECAR}: synced_seq", int(info["sequence"]))
    try:
        factory = check_factory_string(sidecar.get("factory"), dimension)
        check_search_params(sidecar.get("params"))
    except InvalidFactory as exc:
        raise BadArchive(f"{SIDECAR}: {exc}") from exc
    tombstones = sidecar.get("tombstones", [])
    if not isinstance(tombstones, list) or len(tombstones) > MAX_COUNT:
        raise BadArchive(f"{SIDECAR}: tombstones is not a list")
    for chunk_id in tombstones:
        _count(chunk_id, f"{SIDECAR}: a tombstone", 1 << 62)
    if len(set(tombstones)) != len(tombstones):
        raise BadArchive(f"{SIDECAR}: a tombstone is listed twice")
    return factory
