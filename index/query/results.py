"""Result assembly: ranked document ids -> ``SearchHit`` with text, metadata and the chunk that matched."""

from __future__ import annotations

import numpy as np
from opentelemetry import trace

from encoder_runtime.tracing import child_span
from index.query.highlight import highlight_spans
from index.query.ranking import Explanation, Ranked
from index.records import SearchHit
from index.storage.store import ChunkRow
from index.storage.version import OpenVersion
from index.text.analysis import query_terms

tracer = trace.get_tracer(__name__)


def assemble_hits(
    version: OpenVersion,
    ranked: Ranked,
    query_vector: np.ndarray | None,
    query_text: str,
    *,
    explanations: dict[str, Explanation] | None = None,
    highlight: bool = False,
    text_chars: int | None = None,
) -> list[SearchHit]:
    """``text_chars``: each hit's document text cut there (0: the caller shows no text, None: whole)."""
    doc_ids = [doc_id for doc_id, _, _ in ranked]
    with child_span(tracer, "store.read", {"cloze.documents": len(doc_ids)}):
        chunks = version.store.chunks_of(doc_ids)
        documents = version.store.documents_of(doc_ids, text_chars)  # each document's text read once
    hits = []
    for doc_id, score, chunk_id in ranked:
        rows, document = chunks.get(doc_id), documents.get(doc_id)
        if not rows or document is None:
            continue  # deleted between ranking and reading
        row = pick_chunk(version, rows, chunk_id, query_vector, query_text)
        hits.append(
            SearchHit(
                doc_id,
                float(score),
                document.text,
                row.chunk_text,
                row.chunk_index,
                document.metadata,
                highlights=highlight_spans(row.chunk_text, query_text) if highlight else None,
                explanation=explanations.get(doc_id) if explanations is not None else None,
            )
        )
    return hits


def pick_chunk(
    version: OpenVersion,
    rows: list[ChunkRow],
    chunk_id: int | None,
    query_vector: np.ndarray | None,
    query_text: str,
) -> ChunkRow:
    """The matched chunk: known for dense hits; for BM25 hits the closest by vector, else by shared terms."""
    for row in rows:
        if row.chunk_id == chunk_id:
            return row
    if len(rows) == 1:
        return rows[0]
    if query_vector is not None:
        ids, matrix = version.store.vectors([r.chunk_id for r in rows], version.vectors.dimension)
        if len(ids):
            best = int(ids[int(np.argmax(matrix @ np.asarray(query_vector, np.float32).reshape(-1)))])
            return next(r for r in rows if r.chunk_id == best)
    terms = set(query_terms(query_text))
    return max(rows, key=lambda r: sum(1 for w in query_terms(r.chunk_text) if w in terms))
