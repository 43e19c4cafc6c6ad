"""A tail segment: one ``ChangeBatch`` as a gzip'd JSON object (vectors as base64 float32), immutable once
written. Applying it means writing the documents with these vectors: a replica embeds nothing."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import numpy as np

from index.archive.importer import ImportRules, checked_document, checked_vectors
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


def decode(data: bytes, dimension: int, rules: ImportRules) -> tuple[int, ChangeBatch]:
    """The version the segment belongs to, and its batch, each document checked as an upsert into the
    collection checks it (``rules``): the bucket is trusted no more than a restore's archive."""
    try:
        body: dict[str, Any] = json.loads(gzip.decompress(data))
        if body.get("format") != FORMAT:
            raise BadSegment(f"segment format {body.get('format')!r}, this version reads {FORMAT}")
        batch = ChangeBatch(int(body["after"]), int(body["through"]), deletes=list(body["deletes"]))
        for item in body["upserts"]:
            batch.upserts.append(_upsert(item, dimension, rules))
        if not all(isinstance(doc_id, str) for doc_id in batch.deletes):
            raise BadSegment("a tail segment deletes an id that is not text")
        return int(body["version"]), batch
    except (OSError, ValueError, KeyError, TypeError, EOFError, RecursionError) as exc:
        if isinstance(exc, BadSegment):
            raise
        raise BadSegment(f"a tail segment does not decode or holds what no upsert stores: {exc}") from exc


def _upsert(
    item: dict[str, Any], dimension: int, rules: ImportRules
) -> tuple[Document, list[Chunk], np.ndarray | None]:
    document = checked_document(item["id"], item["text"], item["metadata"], rules)
    chunks = [Chunk(int(index), text, 0) for index, text in item["chunks"]]
    if not all(isinstance(c.text, str) and len(c.text) <= rules.limits.max_document_chars for c in chunks):
        raise BadSegment(
            f"document {document.id[:80]!r}: a chunk's text is not text within the document limit"
        )
    vectors = None
    if item["vectors"] is not None:
        flat = np.frombuffer(base64.b64decode(item["vectors"]), np.float32)
        vectors = flat.reshape(len(chunks), dimension)
        # checked, but stored as the writer stored them: a replica's vectors are the writer's, bit for bit
        checked_vectors(vectors, rules, lambda row: f"document {document.id[:80]!r}: chunk {row}")
    return document, chunks, vectors
