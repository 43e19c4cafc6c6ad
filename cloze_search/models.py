"""Typed values the client sends and returns. Answers are read leniently (fields a newer service adds are
ignored), so a client keeps working against a service one version ahead."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

T = TypeVar("T")
Mode = Literal["dense", "bm25", "hybrid"]


def from_json(cls: type[T], data: dict[str, Any]) -> T:
    """``cls`` from an answer's object, keeping the fields ``cls`` declares."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{key: value for key, value in data.items() if key in names})


@dataclass
class Document:
    """A document to store or one read back. ``vector``: only in a collection of your own vectors."""

    id: str
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    vector: list[float] | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "text": self.text, "metadata": self.metadata}
        if self.vector is not None:
            body["vector"] = [float(value) for value in self.vector]
        return body


@dataclass
class Explanation:
    """Where a hit stood in each ranked list (``explain=True``)."""

    dense_score: float | None
    dense_rank: int | None
    bm25_score: float | None
    bm25_rank: int | None
    fused_score: float
    rerank_score: float | None = None
    first_stage_rank: int | None = None


@dataclass
class SearchHit:
    id: str
    score: float
    chunk: str
    chunk_index: int
    metadata: dict[str, Any]
    text: str | None = None  # with ``include_text=True``
    highlights: list[tuple[int, int]] | None = None  # with ``highlight=True``: [start, end) in ``chunk``
    explain: Explanation | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchHit:
        hit = from_json(cls, data)
        if hit.explain is not None:
            hit.explain = from_json(Explanation, data["explain"])
        if hit.highlights is not None:
            hit.highlights = [(int(start), int(end)) for start, end in hit.highlights]
        return hit


@dataclass
class SearchResults:
    results: list[SearchHit]
    took_ms: float
    mode: Mode

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchResults:
        return cls([SearchHit.from_json(hit) for hit in data["results"]], data["took_ms"], data["mode"])

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


@dataclass
class Fusion:
    """How hybrid search merges its lists: ``rrf`` (k, default 60) or ``convex`` (alpha, default 0.5)."""

    method: Literal["rrf", "convex"] = "rrf"
    k: int | None = None
    alpha: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass
class Rerank:
    """Re-score the first stage's best ``candidates`` with a cross-encoder the service serves."""

    candidates: int = 50
    model: str | None = None
    text: Literal["document", "chunk"] = "document"

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass
class Collection:
    name: str
    model: str | None  # None: a collection of your own vectors
    status: str  # ready | opening | failed
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
    dimension: int | None = None
    metric: str | None = None


@dataclass
class Snapshot:
    name: str
    bytes: int
    created: str | None = None
    sequence: int | None = None
    documents: int | None = None
    chunks: int | None = None
    vectors: int | None = None
    version: int | None = None
    model_fingerprint: str | None = None
    problem: str | None = None


@dataclass
class Restored:
    version: int
    sequence: int | None = None
    documents: int | None = None
    chunks: int | None = None


@dataclass
class Job:
    job_id: str
    kind: str
    collection: str
    status: str  # queued | running | succeeded | failed
    progress: float
    done: int
    total: int
    error: str | None = None
    manifest: dict[str, Any] | None = None


@dataclass
class RerankResult:
    index: int  # the text's position in the request
    score: float
    text: str | None = None


@dataclass
class Prediction:
    score: float
    token: int
    token_str: str
    sequence: str
