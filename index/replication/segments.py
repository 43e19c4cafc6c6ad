"""A tail segment: one ``ChangeBatch`` as a gzip'd JSON object (vectors as base64 float32), immutable once
written. Applying it means writing the documents with these vectors: a replica embeds nothing."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import numpy as np

from index.records import Document
from index.storage.changelog import ChangeBatch
from index.text.chunking import Chunk

FORMAT = 1


class BadSegment(ValueError):
    """A segment that does not decode or does not continue from where the replica stands."""


def encode(batch: ChangeBatch, version: int) -> bytes:
    upserts = [
        {
            "id": document.id,
            "text": document.text,
            "metadata": document.metadata,
            "chunks": [[chunk.index, chunk.text] for chunk in chunks],
            "vectors": None
            if vectors is None
            else base64.b64encode(np.ascontiguousarray(vectors, np.float32).tobytes()).decode(),
        }
        for document, chunks, vectors in batch.upserts
    ]
    body = {
        "format": FORMAT,
        "version": version,
        "after": batch.after,
        "through": batch.through,
        "upserts": upserts,
        "deletes": batch.deletes,
    }
    return gzip.compress(json.dumps(body, ensure_ascii=False).encode(), compresslevel=1)


def decode(data: bytes, dimension: int) -> tuple[int, ChangeBatch]:
    """The version the segment belongs to, and its batch."""
    try:
        body: dict[str, Any] = json.loads(gzip.decompress(data))
        if body.get("format") != FORMAT:
            raise BadSegment(f"segment format {body.get('format')!r}, this version reads {FORMAT}")
        batch = ChangeBatch(int(body["after"]), int(body["through"]), deletes=list(body["deletes"]))
        for item in body["upserts"]:
            chunks = [Chunk(int(index), text, 0) for index, text in item["chunks"]]
            vectors = None
            if item["vectors"] is not None:
                flat = np.frombuffer(base64.b64decode(item["vectors"]), np.float32)
                vectors = flat.reshape(len(chunks), dimension)
            batch.upserts.append((Document(item["id"], item["text"], item["metadata"]), chunks, vectors))
        return int(body["version"]), batch
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        if isinstance(exc, BadSegment):
            raise
        raise BadSegment(f"a tail segment does not decode: {exc}") from exc
