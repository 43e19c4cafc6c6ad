"""Hostile snapshot archives, made from a good one: each a claim the archive makes about itself that a
restore must check rather than believe. Shared by the restore tests (index, service and end to end) and the
soak.

Every variant but the decompression bombs has its checksums recomputed, so only the restore's own checks
can refuse it. ``hostile_archives`` must be refused; ``neutralised_archives`` hold what a restore never
reads (a FAISS file, a trigger) and must restore into a collection that works; ``hostile_stores`` edit the
store with SQL, and each is refused naming its problem or neutralised by the import.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sqlite3
import struct
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

INFO, MANIFEST, SIDECAR, VECTORS, STORE = (
    "snapshot.json",
    "manifest.json",
    "vectors.json",
    "vectors.faiss",
    "store.sqlite",
)
ORDER = (INFO, MANIFEST, SIDECAR, VECTORS, STORE)


def unpack(raw: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]


def pack(members: dict[str, bytes], info: Any = None, checksums: bool = True) -> bytes:
    """A tar of ``members`` (``snapshot.json`` first); ``info`` replaces it, with each file's size and
    sha256 recomputed unless ``checksums`` is False."""
    info = info if info is not None else json.loads(members[INFO])
    if checksums and isinstance(info, dict):
        info["files"] = {
            name: {"bytes": len(members[name]), "sha256": hashlib.sha256(members[name]).hexdigest()}
            for name in ORDER[1:]
        }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name in ORDER:
            data = json.dumps(info).encode() if name == INFO else members[name]
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return out.getvalue()


def _json_edit(members: dict[str, bytes], name: str, edit: Callable[[Any], Any]) -> dict[str, bytes]:
    return members | {name: json.dumps(edit(json.loads(members[name]))).encode()}


def relabelled_vectors(members: dict[str, bytes]) -> dict[str, bytes]:
    """The FAISS file of a 32-d model (16-d when the good one is 32-d) under the labels (fingerprint,
    dimension) of the good one."""
    sidecar = json.loads(members[SIDECAR])
    dimension = 16 if json.loads(members[INFO])["dimension"] == 32 else 32
    real = faiss.deserialize_index(np.frombuffer(members[VECTORS], dtype=np.uint8))
    ids = faiss.vector_to_array(faiss.downcast_index(real).id_map) if real.ntotal else np.zeros(0, np.int64)
    small = faiss.IndexIDMap2(faiss.IndexFlatIP(dimension))
    small.add_with_ids(np.random.default_rng(0).random((len(ids), dimension), np.float32), ids)
    sidecar["factory"] = "IDMap2,Flat"
    return members | {VECTORS: faiss.serialize_index(small).tobytes(), SIDECAR: json.dumps(sidecar).encode()}


def faiss_declaring(floats: int, dimension: int) -> bytes:
    """A few hundred bytes of ``IDMap2,Flat`` whose flat codes declare ``floats`` floats and hold none."""
    header = struct.pack("<iqqqBi", dimension, floats // dimension, 1 << 20, 1 << 20, 1, 0)
    return b"IxM2" + header + b"IxFI" + header + struct.pack("<Q", floats // 4) + b"\0" * 256


def not_sqlite() -> bytes:
    return b"this is not a database " * 200


def edited_store(store: bytes, edit: Callable[[sqlite3.Connection], Any]) -> bytes:
    """The store's bytes after ``edit(connection)`` (committed, journal mode DELETE: a single file)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "store.sqlite"
        path.write_bytes(store)
        connection = sqlite3.connect(path)
        try:
            connection.execute("PRAGMA journal_mode=DELETE")
            edit(connection)
            connection.commit()
        finally:
            connection.close()
        return path.read_bytes()


def sqlite_with_trigger(store: bytes) -> bytes:
    """The store with a trigger of its own: it would run on every write after the restore."""
    return edited_store(
        store,
        lambda c: c.execute(
            "CREATE TRIGGER chunks_spy AFTER INSERT ON chunks BEGIN DELETE FROM documents; END"
        ),
    )


def rewritten_schema(store: bytes, name: str, sql: Callable[[str], str]) -> bytes:
    """The schema entry ``name`` rewritten as ``sql(old)`` through ``writable_schema``: SQLite then holds a
    constraint or index as written, never checked against the rows already there."""

    def edit(connection: sqlite3.Connection) -> None:
        (old,) = connection.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
        connection.execute("PRAGMA writable_schema = ON")
        connection.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql(old), name))

    return edited_store(store, edit)


def with_vectors(members: dict[str, bytes], value: float) -> dict[str, bytes]:
    """Every stored vector's numbers set to ``value`` (NaN, an infinity), in the store and in a FAISS file
    rebuilt from it, so that the archive's two copies agree and nothing but a check of the values refuses."""
    dimension = json.loads(members[INFO])["dimension"]
    blob = np.full(dimension, value, np.float32).tobytes()
    store = edited_store(members[STORE], lambda c: c.execute("UPDATE chunks SET vector = ?", (blob,)))
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "s.sqlite").write_bytes(store)
        connection = sqlite3.connect(Path(folder) / "s.sqlite")
        ids = np.array([row[0] for row in connection.execute("SELECT id FROM chunks ORDER BY id")], np.int64)
        connection.close()
    flat = faiss.IndexIDMap2(faiss.IndexFlatIP(dimension))
    flat.add_with_ids(np.full((len(ids), dimension), value, np.float32), ids)
    sidecar = json.loads(members[SIDECAR]) | {"factory": "IDMap2,Flat", "tombstones": []}
    return members | {
        STORE: store,
        VECTORS: faiss.serialize_index(flat).tobytes(),
        SIDECAR: json.dumps(sidecar).encode(),
    }


def nested(levels: int) -> str:
    return '{"a": ' + "[" * levels + "1" + "]" * levels + "}"


def hostile_stores(good: bytes) -> dict[str, tuple[bytes, str | None]]:
    """Archives whose store holds the service's tables, edited (schema or rows), with checksums recomputed:
    each with a word its refusal must name, or None where the import must neutralise it (the restored
    collection then takes writes, reads and searches). Before restores imported, each restored with 200,
    and the collection then failed writes, reads or searches, or dense search found nothing."""
    members = unpack(good)
    store = members[STORE]

    def rows(sql: str, *params: Any) -> bytes:
        return pack(members | {STORE: edited_store(store, lambda c: c.execute(sql, params))})

    def schema(name: str, sql: Callable[[str], str]) -> bytes:
        return pack(members | {STORE: rewritten_schema(store, name, sql)})

    def index(sql: str) -> bytes:  # made empty first, then its definition rewritten as ``sql``
        made = edited_store(store, lambda c: c.execute("CREATE INDEX spy ON documents(id) WHERE rid < 0"))
        return pack(members | {STORE: rewritten_schema(made, "spy", lambda _: sql)})

    return {
        "a CHECK constraint refusing texts of 5 characters or more": (
            schema(
                "documents", lambda sql: sql.replace("DEFAULT '{}'", "DEFAULT '{}' CHECK (length(text) < 5)")
            ),
            None,
        ),
        "a UNIQUE index on chunk text": (rows("CREATE UNIQUE INDEX chunks_text ON chunks(text)"), None),
        "an index whose WHERE clause raises on every write": (
            index("CREATE INDEX spy ON documents(id) WHERE abs(-9223372036854775807 - 1 + 0 * rid) > 0"),
            None,
        ),
        "a trigger of its own": (pack(members | {STORE: sqlite_with_trigger(store)}), None),
        "a row id at the largest integer": (
            rows("UPDATE chunks SET id = 9223372036854775807 WHERE id = (SELECT MAX(id) FROM chunks)"),
            None,
        ),
        "metadata a JSON list": (rows("UPDATE documents SET metadata = '[1, 2]'"), "not a JSON object"),
        "metadata a JSON string": (rows("""UPDATE documents SET metadata = '"red"'"""), "not a JSON object"),
        "metadata 900 levels deep": (
            rows(
                "UPDATE documents SET metadata = ? WHERE rid = (SELECT MIN(rid) FROM documents)", nested(900)
            ),
            "nested",
        ),
        "metadata with NaN": (rows("""UPDATE documents SET metadata = '{"n": NaN}'"""), "NaN"),
        "metadata with a date-time SQLite cannot compare": (
            rows("""UPDATE documents SET metadata = '{"at": "2024-05-01T10:00:00+15:00"}'"""),
            "UTC offset",
        ),
        "NaN vectors": (pack(with_vectors(members, float("nan"))), "NaN"),
        "infinite vectors": (pack(with_vectors(members, float("inf"))), "infinity"),
    }


def gzip_bomb(members: dict[str, bytes], expanded: int = 2 << 30, honest: bool = True) -> bytes:
    """A gzip archive of about expanded/1000 bytes whose store member is ``expanded`` bytes of zeros
    (concatenated gzip members of 64 MiB of zeros each). ``honest``: ``snapshot.json`` declares that size;
    otherwise it declares the real store's and a PAX record of ``expanded`` bytes opens the archive."""
    block = 64 << 20
    zeros = zlib.compressobj(9, zlib.DEFLATED, 31)
    piece = zeros.compress(b"\0" * block) + zeros.flush()
    if not honest:
        pax = tarfile.TarInfo("././@PaxHeader")
        pax.type, pax.size = tarfile.XHDTYPE, expanded
        head = pax.tobuf(tarfile.USTAR_FORMAT)
        return gzip.compress(head, 1) + piece * (expanded // block)
    info = json.loads(members[INFO])
    files = {
        name: {"bytes": len(members[name]), "sha256": hashlib.sha256(members[name]).hexdigest()}
        for name in ORDER[1:4]
    }
    files[STORE] = {"bytes": expanded, "sha256": "0" * 64}
    prefix = io.BytesIO()
    with tarfile.open(fileobj=prefix, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name in ORDER[:4]:
            data = json.dumps(info | {"files": files}).encode() if name == INFO else members[name]
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
        store = tarfile.TarInfo(STORE)
        store.size = expanded
        archive.fileobj.write(store.tobuf(tarfile.USTAR_FORMAT))  # header only: the zeros follow
        archive.offset += tarfile.BLOCKSIZE
        archive.closed = True  # no end-of-archive blocks: the zeros are the store
    return gzip.compress(prefix.getvalue(), 1) + piece * (expanded // block)


def hostile_archives(good: bytes) -> dict[str, tuple[bytes, int, str]]:
    """Each hostile archive, with the status its restore must get and a word its refusal must name."""
    members = unpack(good)
    info = json.loads(members[INFO])

    def with_files(value: Any) -> bytes:
        files = dict(info["files"]) | {VECTORS: value}
        return pack(members, info | {"files": files}, checksums=False)

    return {
        "vectors.json efSearch 'abc'": (
            pack(_json_edit(members, SIDECAR, lambda s: s | {"params": {"efSearch": "abc"}})),
            422,
            "efSearch",
        ),
        "vectors.json factory NSG64": (
            pack(_json_edit(members, SIDECAR, lambda s: s | {"factory": "NSG64"})),
            422,
            "NSG64",
        ),
        "snapshot.json files entry a number": (with_files(5), 422, "vectors.faiss"),
        "snapshot.json files entry null": (with_files(None), 422, "vectors.faiss"),
        "snapshot.json files entry a list": (with_files([]), 422, "vectors.faiss"),
        "snapshot.json a list": (pack(members, [], checksums=False), 422, "list"),
        "manifest.json a list": (pack(members | {MANIFEST: b"[]"}), 422, "manifest.json"),
        "store.sqlite not SQLite": (pack(members | {STORE: not_sqlite()}), 422, "store.sqlite"),
        "gzip of ~2 MB declaring 2 GiB": (gzip_bomb(members), 413, "bound"),
        "gzip of ~2 MB with a 2 GiB PAX record": (gzip_bomb(members, honest=False), 413, "expands past"),
    }


def neutralised_archives(good: bytes) -> dict[str, bytes]:
    """Archives whose FAISS file lies, each of which must restore into a collection that works: a restore
    rebuilds FAISS from the imported vectors and never reads the archive's file."""
    members = unpack(good)
    dimension = int(json.loads(members[INFO])["dimension"])
    return {
        "32-d vectors relabelled as the collection's model": pack(relabelled_vectors(members)),
        "vectors.faiss of 338 bytes declaring 2^28 floats": pack(
            members | {VECTORS: faiss_declaring(1 << 28, dimension)}
        ),
        "vectors.faiss not FAISS": pack(members | {VECTORS: b"not an index" * 40}),
    }
