"""Restoring a snapshot: everything checked (``index.archive.checks``) before anything is written, then the
archive's files extracted into a new version folder's staging folder (each checksum checked again as it is
written), its store's rows imported into a store this service creates (``index.archive.importer``: the archive's own
store, schema and FAISS file are never opened as the index), FAISS rebuilt from the imported vectors, and
the version opened and published atomically under the writer lock. The draft carries the rebuild marker, so
a restore killed before its switch is deleted when the next writer opens the index."""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import json
import reprlib
import shutil
import sqlite3
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from index.archive import checks
from index.archive.checks import ARCHIVE_FORMAT, FILES, INFO, MAX_INFO_BYTES, SIDECAR, BadArchive
from index.archive.importer import ImportRules, import_store, rebuild_vectors
from index.faultpoints import pause_for_tests
from index.records import IndexError_, StorageError
from index.storage import layout
from index.storage.columns import Columns
from index.storage.layout import FORMAT_VERSION, REBUILD_MARKER
from index.storage.lexical import FOLDER as LEXICAL
from index.storage.lexical import LexicalIndex
from index.storage.store import DocumentStore
from index.storage.version import OpenVersion

READ_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)
STAGING = ".archive"  # inside the draft: the archive's files while they are imported, then deleted
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class ExpectedModel:
    """What the collection restored into runs: an archive of another model is foreign."""

    fingerprint: str
    dimension: int


def verify_archive(
    path: Path, expected: ExpectedModel | None, target: Path, *, data_checksums: bool = True
) -> dict[str, Any]:
    """Every check a restore makes before it writes anything (``index.archive.checks``); returns
    ``snapshot.json``. ``BadArchive`` / ``ArchiveTooLarge`` name the problem: not a tar, truncated, an
    unexpected member, a declared field of the wrong type or past its bound, contents larger than the
    archive may expand to or ``target``'s disk holds, a size or checksum that differs, another format,
    another model, a manifest or sidecar that is not what this service writes. ``data_checksums=False``
    reads past the store and the FAISS file without checksumming them: for an archive no other process can
    change (a replica's own download), since ``extract_archive`` checksums every member as it writes the
    draft, before anything is published."""
    with _open_archive(path) as (archive, reader):
        info = _read_info_member(archive)
        _check_compatible(info, expected)
        reader.limit = checks.check_expansion(info, Path(path).stat().st_size, Path(target))
        for member, stream in _members(archive, info):
            expected_file = info["files"][member.name]
            if member.name in (layout.MANIFEST, SIDECAR):
                content = _read_json_member(stream, member.name, expected_file)
                if member.name == layout.MANIFEST:
                    fingerprint = expected.fingerprint if expected else None
                    checks.check_manifest(
                        content, info, fingerprint, expected.dimension if expected else None
                    )
                else:
                    checks.check_sidecar(content, info, int(info["dimension"]))
            elif data_checksums:
                _copy_checked(stream, member.name, expected_file, None)
    return info


def extract_archive(path: Path, folder: Path, info: dict[str, Any], *, with_faiss: bool = False) -> None:
    """Each file the import reads into ``folder`` (a staging folder no reader looks at), its checksum checked
    again as it is written (the archive could have changed since it was verified). Not fsync'd: the files are
    read once and deleted; what is published is the import. ``vectors.faiss`` is checksummed and skipped
    unless ``with_faiss`` (a replica's own base, whose FAISS training is reused): FAISS is rebuilt from the
    imported vectors, so an uploaded archive's FAISS file is never read."""
    with _open_archive(path) as (archive, reader):
        _read_info_member(archive)
        reader.limit = checks.declared_bytes(info) + checks.TAR_OVERHEAD + MAX_INFO_BYTES
        for member, stream in _members(archive, info):
            expected = info["files"][member.name]
            if member.name == layout.VECTORS and not with_faiss:
                _copy_checked(stream, member.name, expected, None)
                continue
            with (folder / member.name).open("wb") as out:
                _copy_checked(stream, member.name, expected, out)


def read_info(path: Path) -> dict[str, Any]:
    """The archive's ``snapshot.json`` (its first member, checked), without reading the rest."""
    with _open_archive(path) as (archive, _):
        return _read_info_member(archive)


@contextlib.contextmanager
def _open_archive(path: Path) -> Iterator[tuple[tarfile.TarFile, checks.BoundedReader]]:
    """The archive read front to back (gzip or plain), every byte counted: until ``snapshot.json`` is read
    and its sizes accepted, the reader stops past the size of that one member."""
    try:
        raw: IO[bytes] = Path(path).open("rb")
    except OSError as exc:
        raise BadArchive(f"the archive cannot be read: {exc.strerror}") from exc
    with raw:
        try:
            stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == GZIP_MAGIC else raw  # type: ignore[attr-defined]
            reader = checks.BoundedReader(stream, MAX_INFO_BYTES + checks.TAR_OVERHEAD)
            archive = tarfile.open(fileobj=reader, mode="r|")  # type: ignore[call-overload]
        except ARCHIVE_ERRORS as exc:
            raise BadArchive(f"the archive is not a readable tar archive (.tar or .tar.gz): {exc}") from exc
        with archive:
            yield archive, reader


def _read_info_member(archive: tarfile.TarFile) -> dict[str, Any]:
    try:
        first = archive.next()
    except ARCHIVE_ERRORS as exc:
        raise BadArchive(f"the archive is truncated or not a tar archive: {exc}") from exc
    if first is None or first.name != INFO or not first.isreg():
        found = "nothing" if first is None else repr(first.name[:100])
        raise BadArchive(f"the archive is not a cloze snapshot: its first member is {found}, not {INFO}")
    if first.size > MAX_INFO_BYTES:
        raise BadArchive(f"{INFO} is {first.size} bytes, over the {MAX_INFO_BYTES}-byte limit")
    try:
        stream = archive.extractfile(first)
        info = json.loads(stream.read() if stream else b"")
    except (*ARCHIVE_ERRORS, ValueError, RecursionError) as exc:
        raise BadArchive(f"{INFO} is truncated or not JSON: {str(exc)[:200]}") from exc
    return checks.check_info(info)


def _check_compatible(info: dict[str, Any], expected: ExpectedModel | None) -> None:
    if info.get("format") != ARCHIVE_FORMAT:
        raise BadArchive(
            f"snapshot format {reprlib.repr(info.get('format'))}, but this version of cloze-search reads format "
            f"{ARCHIVE_FORMAT}"
        )
    if info.get("index_format") != FORMAT_VERSION:
        raise BadArchive(
            f"the snapshot holds an index of format {reprlib.repr(info.get('index_format'))}; this version reads "
            f"format {FORMAT_VERSION}"
        )
    if expected is not None and (
        info.get("model_fingerprint") != expected.fingerprint or info.get("dimension") != expected.dimension
    ):
        raise BadArchive(
            f"the snapshot was made with model {str(info.get('model_id'))[:80]!r} (fingerprint "
            f"{str(info.get('model_fingerprint'))[:40]}, dimension {info.get('dimension')}), but this "
            f"collection runs fingerprint {expected.fingerprint}, dimension {expected.dimension}: restore it "
            "into a collection of that model"
        )


def _members(archive: tarfile.TarFile, info: dict[str, Any]) -> Iterator[tuple[tarfile.TarInfo, IO[bytes]]]:
    """The remaining members in order, each checked to be a plain file the snapshot lists, once."""
    seen: set[str] = set()
    while True:
        try:
            member = archive.next()
        except ARCHIVE_ERRORS as exc:
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
        if member.size != info["files"][member.name]["bytes"]:
            raise BadArchive(
                f"{member.name} is {member.size} bytes in the archive, {INFO} says "
                f"{info['files'][member.name]['bytes']}"
            )
        seen.add(member.name)
        stream = archive.extractfile(member)
        assert stream is not None  # a regular file always has one
        yield member, stream
    missing = sorted(set(FILES) - seen)
    if missing:
        raise BadArchive(f"the archive is truncated: {', '.join(missing)} missing")


def _read_json_member(stream: IO[bytes], name: str, expected: dict[str, Any]) -> Any:
    """A small member (its declared size is bounded), checksummed, then parsed."""
    buffer = io.BytesIO()
    _copy_checked(stream, name, expected, buffer)
    try:
        return json.loads(buffer.getvalue())
    except (ValueError, RecursionError) as exc:
        raise BadArchive(f"{name} is not JSON: {str(exc)[:200]}") from exc


def _copy_checked(stream: IO[bytes], name: str, expected: dict[str, Any], out: IO[bytes] | None) -> None:
    digest, size = hashlib.sha256(), 0
    try:
        while block := stream.read(READ_CHUNK):
            digest.update(block)
            size += len(block)
            if out is not None:
                out.write(block)
    except ARCHIVE_ERRORS as exc:
        if out is not None and isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile):
            raise  # a write error (a full disk) is the disk's problem, not the archive's
        raise BadArchive(f"{name} is truncated or damaged in the archive: {exc}") from exc
    if size != expected["bytes"]:
        raise BadArchive(f"{name} is truncated: {size} bytes read, {expected['bytes']} expected")
    if digest.hexdigest() != expected["sha256"]:
        raise BadArchive(
            f"{name} is corrupted: its sha256 is {digest.hexdigest()}, {INFO} says {expected['sha256']}"
        )


def prepare_version(
    root: Path, number: int, archive: Path, info: dict[str, Any], rules: ImportRules, private: bool = False
) -> None:
    """The archive's contents as version ``number``, unpublished and marked as a draft to discard if this
    process dies: its rows imported into a new store (``importer``), FAISS rebuilt from them, and the
    manifest (checked in ``verify_archive``) renumbered, its counts and FAISS settings those of the import.
    ``private``: the archive is a replica's download of its writer's base: FAISS adopts the base's lists
    (renumbered, checked) or takes its training instead of training and adding again (``rebuild_vectors``:
    most of a large restore's time)."""
    folder = layout.version_dir(root, number)
    folder.mkdir(parents=True)
    (folder / REBUILD_MARKER).touch()
    staging = folder / STAGING
    staging.mkdir()
    extract_archive(archive, staging, info, with_faiss=private)
    dimension = int(info["dimension"])
    sidecar = json.loads((staging / SIDECAR).read_bytes())
    checks.check_sidecar(sidecar, info, dimension)
    store = DocumentStore(folder / layout.STORE)  # as a new collection's store is made
    try:
        renumbered = import_store(staging / layout.STORE, store, dimension, int(info["sequence"]), rules)
        shipped = staging / layout.VECTORS if private else None
        vectors = rebuild_vectors(store, dimension, sidecar, shipped, renumbered)
        vectors.save(folder / layout.VECTORS, {"synced_seq": store.max_seq()})
        Columns.save_from_store(store, folder)
        build_lexical(folder, store)
        counts = store.counts()
    finally:
        store.close()
    manifest = json.loads((staging / layout.MANIFEST).read_bytes())
    shutil.rmtree(staging)
    for claim in ("checksum", "input_checksum", "stage_seconds"):  # of the archive's build, not this import
        manifest.pop(claim, None)
    manifest |= counts | {
        "version": number,
        "factory": vectors.factory,
        "search_params": vectors.params,
        "vectors": vectors.ntotal,
        "restored_from": {"sequence": info.get("sequence"), "created": info.get("created")},
    }
    layout.write_manifest(folder, manifest)  # last: the version is complete only then


def build_lexical(folder: Path, store: DocumentStore) -> None:
    """BM25's index built from the imported rows, as FAISS is (an archive carries none: building it costs about
    what checking a shipped one against the rows would), so the restored version serves BM25 from its first
    search. One that fails (logged) is built again in the background when the version opens."""
    lexical = LexicalIndex(folder / LEXICAL)
    try:
        lexical.build(store)
    finally:
        lexical.stop()


def open_restored(
    root: Path,
    number: int,
    archive: Path,
    info: dict[str, Any],
    rules: ImportRules,
    on_repair: Any = None,
    private: bool = False,
) -> OpenVersion:
    """``prepare_version``, then the draft opened. A draft that passed every check and still does not open
    is the archive's fault (422), a full disk the disk's (413: the archive is too large for it); the
    messages name no path on the server."""
    try:
        prepare_version(root, number, archive, info, rules, private)
        return OpenVersion(root, number, False, on_repair)
    except (BadArchive, checks.ArchiveTooLarge):
        raise
    except (OSError, StorageError) as exc:
        if (isinstance(exc, StorageError) and exc.full) or getattr(exc, "errno", None) in NO_SPACE:
            raise checks.ArchiveTooLarge(
                "the collection's disk filled while the archive was imported"
            ) from exc
        raise
    except (ValueError, KeyError, TypeError, RuntimeError, sqlite3.Error, IndexError_) as exc:
        raise BadArchive(f"the restored copy does not open ({type(exc).__name__})") from exc


def check_restored(version: OpenVersion, info: dict[str, Any]) -> None:
    """The imported copy must hold what the archive says it holds, FAISS every imported vector and BM25 every
    imported document."""
    counts = version.store.counts()
    if counts["documents"] != info.get("documents") or counts["chunks"] != info.get("chunks"):
        raise BadArchive(
            f"the restored store holds {counts}, the snapshot says {info.get('documents')} documents"
        )
    if version.lexical.ready and version.lexical.documents != counts["documents"]:
        raise BadArchive(
            f"BM25's index of the restored copy holds {version.lexical.documents} documents, the store "
            f"{counts['documents']}"
        )
    version.verify()


def restore_offline(root: Path, archive: Path, rules: ImportRules | None = None) -> dict[str, Any]:
    """``cloze index restore`` without a service: takes the writer lock (``IndexLocked`` naming the holder
    while a service writes the index), verifies, imports into a new version and publishes it. ``rules``: what
    an upsert into the collection checks (by default: a model's collection, the default limits)."""
    root = Path(root)
    lease = layout.WriterLease(root)
    try:
        with layout.build_lock(root):
            current = layout.current_version(root)
            manifest = layout.read_manifest_safely(layout.version_dir(root, current)) if current else None
            expected = (
                ExpectedModel(manifest["model_fingerprint"], int(manifest["dimension"])) if manifest else None
            )
            info = verify_archive(archive, expected, root)
            number = layout.next_version(root)
            try:
                version = open_restored(root, number, archive, info, rules or ImportRules())
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
