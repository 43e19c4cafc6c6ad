"""Ranking: dense candidates to best chunk per document, and the fusion of the dense and BM25 lists for hybrid
search (reciprocal rank fusion by default, or a convex combination of normalised scores)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from index.storage.columns import Selection
from index.storage.version import OpenVersion

RRF_K = 60  # the constant of Cormack et al. (2009); robust across collections
# Candidates taken from each list before fusion: 3 x top_k, at least 30, for a third of the dense candidates
# to map to documents; a deeper pool barely moved SciFact's hybrid nDCG@10 (docs/benchmarks.md, "Design
# measurements").
FUSION_DEPTH, FUSION_PER_RESULT = 30, 3
# A filter's matches (from the in-memory columns) are scored exactly, read back from FAISS, where the index can
# read vectors back (flat, HNSW) and they are few (``VectorIndex.exact_filter_limit``); else one FAISS search
# skips the rest by a bitmap. None: that limit; a number overrides it (tests and the crossover measurement of
# benchmarks/filtered_search.py).
SELECTIVE_CHUNKS: int | None = None

Ranked = list[tuple[str, float, int | None]]  # (doc_id, score, best chunk id when known), best first
Scored = list[tuple[str, float]]  # (doc_id, score), best first: what BM25 returns


@dataclass(frozen=True)
class Fusion:
    """How hybrid search merges its dense and BM25 lists. ``rrf``: by ranks, 1 / (k + rank) summed, no
    calibration needed. ``convex``: alpha x dense + (1 - alpha) x BM25, each min-max normalised over its own
    candidate list (a document absent from a list scores 0 there); alpha weights dense."""

    method: Literal["rrf", "convex"] = "rrf"
    k: int = RRF_K
    alpha: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in ("rrf", "convex"):
            raise ValueError(f"unknown fusion method {self.method!r} (rrf or convex)")
        if self.k < 1:
            raise ValueError(f"fusion k {self.k} is below 1")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"fusion alpha {self.alpha} is outside 0..1")

    @classmethod
    def parse(cls, text: str) -> Fusion:
        """``rrf``, ``rrf:20``, ``convex``, ``convex:0.3``: the command line's spelling."""
        method, _, value = text.partition(":")
        if method == "rrf":
            return cls("rrf", k=int(value) if value else RRF_K)
        if method == "convex":
            return cls("convex", alpha=float(value) if value else 0.5)
        raise ValueError(f"unknown fusion {text!r} (rrf[:K] or convex[:ALPHA])")

    def label(self) -> str:
        return f"rrf{self.k}" if self.method == "rrf" else f"convex{self.alpha:g}"


@dataclass(frozen=True)
class Explanation:
    """Why a hit ranked where it did: each list's score and 1-based rank (None when the hit was not in that
    list, or the mode ran no such list) and the score it was ranked by."""

    dense_score: float | None
    dense_rank: int | None
    bm25_score: float | None
    bm25_rank: int | None
    fused_score: float


def fusion_depth(top_k: int) -> int:
    return max(FUSION_DEPTH, FUSION_PER_RESULT * top_k)


def dense_ranking(
    version: OpenVersion, query: np.ndarray | None, top_k: int, selection: Selection | None
) -> Ranked:
    """Best chunk per document, best documents first; ``selection``: a filter's matches (``OpenVersion.select``)."""
    query = np.asarray(query, dtype=np.float32).reshape(-1)
    if selection is not None:
        return selected_ranking(version, query, top_k, selection)
    wanted = top_k * 3 + 10
    total = version.vectors.ntotal
    while True:
        ids, scores = _candidates(version, query, wanted, None)
        ranked = best_chunk_per_document(version, ids, scores, top_k)
        if len(ranked) >= top_k or wanted >= total:
            return ranked
        wanted *= 4


def selected_ranking(version: OpenVersion, query: np.ndarray, top_k: int, selection: Selection) -> Ranked:
    """A filter's matches scored exactly when few (``exact_filter_limit``) and the index reads vectors back;
    else one FAISS search that skips non-matching ids (a bitmap), with its search widened by the match rate
    (``VectorIndex.filtered_settings``)."""
    count, vectors = selection.chunk_count, version.vectors
    if not count or not vectors.ntotal:
        return []
    limit = vectors.exact_filter_limit() if SELECTIVE_CHUNKS is None else SELECTIVE_CHUNKS
    if count <= limit and vectors.reconstructable:
        ids = selection.chunk_ids()
        try:
            return best_chunk_per_document(version, ids, vectors.reconstruct(ids) @ query, top_k)
        except RuntimeError:  # a chunk not in FAISS (no vector yet): search instead
            pass
    rate, deepened = min(1.0, count / vectors.ntotal), 0
    wanted = top_k * 3 + 10
    while True:
        overrides = vectors.filtered_settings(rate, deepened)
        ids, scores = _candidates(version, query, wanted, selection.chunks, overrides)
        ranked = best_chunk_per_document(version, ids, scores, top_k)
        if len(ranked) >= top_k or wanted >= count:
            return ranked
        # Short: more candidates, and where the search found fewer than asked, its matches lie beyond the
        # lists / graph region it reached: widen that too.
        deepened += len(ids) < min(wanted, count)
        wanted *= 4


def _candidates(
    version: OpenVersion,
    query: np.ndarray,
    wanted: int,
    allowed: np.ndarray | None,
    overrides: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    rerank = int(version.vectors.params.get("rerank", 0)) if version.vectors.lossy else 0
    scores, ids = version.vectors.search(query, wanted * max(rerank, 1), allowed, overrides)
    if rerank:  # PQ scores are approximate: re-score the candidates with the exact stored vectors
        ids, matrix = version.store.vectors(ids, version.vectors.dimension)
        scores = matrix @ query
    return ids, scores


def best_chunk_per_document(version: OpenVersion, ids: np.ndarray, scores: np.ndarray, top_k: int) -> Ranked:
    """Best chunk per document, in score order. Owners are read in growing slices of the ranking: most
    documents have few chunks, so the first 2 x top_k chunks usually name top_k documents already."""
    order = np.argsort(-scores)
    best: dict[str, tuple[float, int]] = {}
    start, size = 0, max(2 * top_k, 20)
    while start < len(order) and len(best) < top_k:
        window = order[start : start + size]
        owners = version.store.chunk_documents(ids[window].tolist())
        for position in window:
            chunk_id = int(ids[position])
            doc_id = owners.get(chunk_id)
            if doc_id is not None and doc_id not in best:
                best[doc_id] = (float(scores[position]), chunk_id)
        start, size = start + size, size * 2
    ranked = sorted(best.items(), key=lambda item: (-item[1][0], item[0]))  # ties: the same on every copy
    return [(doc_id, score, chunk_id) for doc_id, (score, chunk_id) in ranked[:top_k]]


def reciprocal_rank_fusion(lists: list[list[tuple[str, int | None]]], k: int = RRF_K) -> Ranked:
    """RRF: score = sum over lists of 1 / (k + rank). Ranks, not scores, so cosine and BM25 need no
    calibration. A document keeps the first chunk id any list knows for it."""
    scores: dict[str, float] = {}
    chunk: dict[str, int | None] = {}
    for ranked in lists:
        for rank, (doc_id, chunk_id) in enumerate(ranked, start=1):
            scores[doc_id] = scores.get(doc_id, 0.0) + 1.0 / (k + rank)
            if chunk.get(doc_id) is None:
                chunk[doc_id] = chunk_id
    order = sorted(scores, key=lambda d: -scores[d])
    return [(doc_id, scores[doc_id], chunk[doc_id]) for doc_id in order]


def convex_fusion(dense: Ranked, sparse: Scored, alpha: float) -> Ranked:
    """alpha x normalised dense + (1 - alpha) x normalised BM25 over the union of both candidate lists.
    Min-max per list: cosine and BM25 live on different scales, and BM25's depends on the query's length."""
    dense_norm = _min_max({doc_id: score for doc_id, score, _ in dense})
    sparse_norm = _min_max(dict(sparse))
    chunk = {doc_id: chunk_id for doc_id, _, chunk_id in dense}
    pool = list(dict.fromkeys([*dense_norm, *sparse_norm]))
    scores = {d: alpha * dense_norm.get(d, 0.0) + (1.0 - alpha) * sparse_norm.get(d, 0.0) for d in pool}
    order = sorted(pool, key=lambda d: -scores[d])  # stable: ties keep dense order, then BM25's
    return [(doc_id, scores[doc_id], chunk.get(doc_id)) for doc_id in order]


def _min_max(scores: dict[str, float]) -> dict[str, float]:
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high <= low:  # one candidate, or all tied: each is the list's best
        return dict.fromkeys(scores, 1.0)
    return {d: (s - low) / (high - low) for d, s in scores.items()}


def fuse(dense: Ranked, sparse: Scored, fusion: Fusion) -> Ranked:
    if fusion.method == "convex":
        return convex_fusion(dense, sparse, fusion.alpha)
    return reciprocal_rank_fusion([[(d, c) for d, _, c in dense], [(d, None) for d, _ in sparse]], fusion.k)


def explain(ranked: Ranked, dense: Ranked | None, sparse: Scored | None) -> dict[str, Explanation]:
    """Each ranked document's place in the lists it was ranked from (``ranked`` may be one page of them)."""
    dense_at = {d: (s, r) for r, (d, s, _) in enumerate(dense or [], start=1)}
    sparse_at = {d: (s, r) for r, (d, s) in enumerate(sparse or [], start=1)}
    out = {}
    for doc_id, score, _ in ranked:
        d_score, d_rank = dense_at.get(doc_id, (None, None))
        s_score, s_rank = sparse_at.get(doc_id, (None, None))
        out[doc_id] = Explanation(d_score, d_rank, s_score, s_rank, float(score))
    return out
