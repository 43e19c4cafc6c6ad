# Generated from the service's OpenAPI schemas by `python -m tools.generate_client`: do not edit.
"""Typed values the client sends and returns, generated from the service's OpenAPI schemas (the
client imports neither the service nor pydantic: ``_model_base``). Answers are read leniently (fields a newer
service adds are ignored), so a client keeps working against a service one version ahead."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from cloze_search._model_base import Model

Mode = Literal["dense", "bm25", "hybrid"]


@dataclass
class Document(Model):
    """A document to store or one read back. ``vector``: only in a collection of your own vectors."""

    id: str
    # Embedded by the collection's model; optional in a collection of your own vectors
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    # Collections of your own vectors only (and required there): the document's one vector
    vector: list[float] | None = None


@dataclass
class Explanation(Model):
    """Where a hit stood in each ranked list; null where it was not in that list (or the mode ran none)."""

    # cosine of the hit's best chunk to the query
    dense_score: float | None
    # 1-based place in the dense list
    dense_rank: int | None
    # BM25 score of the document
    bm25_score: float | None
    # 1-based place in the BM25 list
    bm25_rank: int | None
    # the first stage's score (the hit's `score` unless reranked)
    fused_score: float
    # with `rerank`: the reranker's relevance (0..1), the score the hit was ranked by
    rerank_score: float | None = None
    # with `rerank`: the hit's 1-based place in the first stage's ranking
    first_stage_rank: int | None = None


@dataclass
class SearchHit(Model):
    """One hit: a document, its best chunk and its score."""

    id: str
    score: float
    chunk: str
    chunk_index: int
    metadata: dict[str, Any]
    # With `include_text`: the document's whole text
    text: str | None = None
    # With `highlight`: [start, end) offsets in `chunk`, in Unicode code points, sorted, of the words that
    # match a query term
    highlights: list[tuple[int, int]] | None = None
    # With `explain`: how the hit was ranked
    explain: Explanation | None = None


@dataclass
class SearchResults(Model):
    """A search's answer; iterating it (and ``len``) goes over ``results``."""

    results: list[SearchHit]
    took_ms: float
    mode: Mode

    def __iter__(self) -> Iterator[SearchHit]:
        """The hits, best first: ``for hit in client.search(...)``."""
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


@dataclass
class Fusion(Model):
    """How hybrid search merges its dense and BM25 lists."""

    # `rrf`: reciprocal rank fusion, a hit scores the sum over lists of 1 / (k + rank). `convex`: alpha x
    # dense + (1 - alpha) x BM25, each score min-max normalised over its own candidate list (0 when the hit
    # is not in that list). Each list holds max(30, 3 x (offset + top_k)) candidates, so a top 10 may shift
    # with top_k, a convex one more than an RRF one
    method: Literal["rrf", "convex"] = "rrf"
    # RRF's constant (rrf only; default 60)
    k: int | None = None
    # the dense list's weight (convex only; default 0.5)
    alpha: float | None = None


@dataclass
class Rerank(Model):
    """Search's second stage: a cross-encoder re-scores the first stage's best candidates."""

    # How many of the first stage's best documents (any mode) the reranker re-scores; at least offset +
    # top_k, at most CLOZE_MAX_RERANK_CANDIDATES
    candidates: int = 50
    # A reranker's name (GET /models); absent: `default`, else the first served
    model: str | None = None
    # What is scored against the query: the document's text (the reranker reads as much as its window
    # holds), or the hit's matching chunk (for documents longer than the window)
    text: Literal["document", "chunk"] = "document"


@dataclass
class Collection(Model):
    """A collection: its model (None: your own vectors), status and counts."""

    name: str
    # null for a collection of your own vectors
    model: str | None
    # ready, opening or failed (then `error` says why)
    status: str
    # a collection of your own vectors: their length
    dimension: int | None = None
    # a collection of your own vectors: cosine or dot
    metric: str | None = None
    error: str | None = None
    documents: int | None = None
    chunks: int | None = None
    version: int | None = None
    factory: str | None = None
    chunk_window: int | None = None
    chunk_overlap: int | None = None
    bytes_on_disk: int | None = None
    last_write: str | None = None
    created: str | None = None


@dataclass
class Snapshot(Model):
    """One archive: its name (for download, delete and restore) and what it holds."""

    name: str
    bytes: int
    created: str | None = None
    # the changelog sequence the snapshot holds writes up to
    sequence: int | None = None
    documents: int | None = None
    chunks: int | None = None
    vectors: int | None = None
    # the index version it was taken from
    version: int | None = None
    model_fingerprint: str | None = None
    # set when the archive's own description does not read
    problem: str | None = None


@dataclass
class Restored(Model):
    """What a restore published: the new version and what it holds."""

    # the new version that now serves the collection
    version: int
    sequence: int | None = None
    documents: int | None = None
    chunks: int | None = None


@dataclass
class Job(Model):
    """A rebuild's status; ``progress`` is ``done`` / ``total`` (0 while the job reads its input)."""

    job_id: str
    kind: str
    collection: str
    status: Literal["queued", "running", "succeeded", "failed"]
    progress: float
    done: int
    total: int
    error: str | None = None
    manifest: dict[str, Any] | None = None


@dataclass
class RerankResult(Model):
    """One text's relevance to the query."""

    # the text's position in the request
    index: int
    score: float
    text: str | None = None


@dataclass
class Prediction(Model):
    """One candidate for a mask token: its score, token and filled-in text."""

    score: float
    token: int
    token_str: str
    sequence: str
