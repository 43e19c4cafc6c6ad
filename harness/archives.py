"""Hostile snapshot archives, made from a good one: each a claim the archive makes about itself that a
restore must check rather than believe. Shared by the restore tests (index and end to end) and the soak.

Every variant but the decompression bombs has its checksums recomputed, so only the restore's own checks
can refuse it.
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


def sqlite_with_trigger(store: bytes) -> bytes:
    """The store with a trigger of its own: it would run on every write after the restore."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "store.sqlite"
        path.write_bytes(store)
        connection = sqlite3.connect(path)
        connection.execute("PRAGMA journal_mode=DELETE")
        connection.execute(
            "CREATE TRIGGER chunks_spy AFTER INSERT ON chunks BEGIN DELETE FROM documents; END"
        )
        connection.commit()
        connection.close()
        return path.read_bytes()


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
        "32-d vectors relabelled as the collection's model": (
            pack(relabelled_vectors(members)),
            422,
            "dimension",
        ),
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
        "vectors.faiss of 338 bytes declaring 2^28 floats": (
            pack(members | {VECTORS: faiss_declaring(1 << 28, int(info["dimension"]))}),
            422,
            "vectors.faiss",
        ),
        "snapshot.json files entry a number": (with_files(5), 422, "vectors.faiss"),
        "snapshot.json files entry null": (with_files(None), 422, "vectors.faiss"),
        "snapshot.json files entry a list": (with_files([]), 422, "vectors.faiss"),
        "snapshot.json a list": (pack(members, [], checksums=False), 422, "list"),
        "manifest.json a list": (pack(members | {MANIFEST: b"[]"}), 422, "manifest.json"),
        "store.sqlite not SQLite": (pack(members | {STORE: not_sqlite()}), 422, "store.sqlite"),
        "store.sqlite with a foreign trigger": (
            pack(members | {STORE: sqlite_with_trigger(members[STORE])}),
            422,
            "trigger",
        ),
        "gzip of ~2 MB declaring 2 GiB": (gzip_bomb(members), 413, "bound"),
        "gzip of ~2 MB with a 2 GiB PAX record": (gzip_bomb(members, honest=False), 413, "expands past"),
    }
