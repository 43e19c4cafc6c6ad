"""Hard negatives from the service's own first stage: each judged query is searched in hybrid mode over an
index of the corpus, and its top candidates that are not judged relevant become negatives, unless they look
like unjudged positives.

The false-negative guard is NV-Retriever's TopK-PercPos (Moreira et al. 2024), as sentence-transformers'
``mine_hard_negatives(relative_margin=...)`` applies it: a candidate whose dense score for the query is above
``(1 - relative_margin)`` times the positive's is too close to trust as a negative and is skipped. The
candidate's score is the one hybrid search ranked it by (its best chunk's cosine); the positive's is the
cosine of its first window, usually lower than a best chunk's, so the guard errs toward skipping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from encoder_training.reranking.judged import JudgedQuery, normalized
from index.search_index import SearchIndex


@dataclass
class MiningSettings:
    num_negatives: int = 7
    range_min: int = 0  # skip this many top candidates outright
    range_max: int = 30  # candidates looked at per query (hybrid's top N)
    relative_margin: float = 0.05  # TopK-PercPos; None or <= 0: off


@dataclass
class MinedQuery:
    query: JudgedQuery
    negatives: list[str]  # texts, best-ranked first
    negative_ids: list[str]


def first_stage(index: SearchIndex, encoder: Any, texts: list[str], top_k: int, mode: str = "hybrid"):
    """The hybrid search a served ``/search`` runs, for many queries at once: one embedding pass, then one
    search each (with each hit's dense score, for the guard)."""
    vectors = encoder.embed(texts, normalize=True)
    return [
        index.search(vector, text, top_k=top_k, mode=mode, explained=True)  # type: ignore[arg-type]
        for vector, text in zip(vectors, texts, strict=True)
    ], vectors


def mine_negatives(
    queries: list[JudgedQuery], index: SearchIndex, encoder: Any, settings: MiningSettings
) -> tuple[list[MinedQuery], dict[str, int]]:
    """Negatives per query (possibly fewer than asked when the guard skips many) and counts of what was skipped."""
    hits_per_query, query_vectors = first_stage(index, encoder, [q.text for q in queries], settings.range_max)
    positive_scores = _positive_scores(queries, query_vectors, encoder)
    stats = {"candidates": 0, "positives": 0, "guarded": 0, "negatives": 0}
    mined = []
    for query, hits, positive_score in zip(queries, hits_per_query, positive_scores, strict=True):
        ids, texts = set(query.positive_ids()), query.positive_texts()
        negatives: list[tuple[str, str]] = []
        for rank, hit in enumerate(hits):
            stats["candidates"] += 1
            if hit.id in ids or normalized(hit.text) in texts:
                stats["positives"] += 1
            elif rank < settings.range_min:
                continue
            elif _too_close(hit, positive_score, settings.relative_margin):
                stats["guarded"] += 1
            elif len(negatives) < settings.num_negatives:
                negatives.append((hit.id, hit.text))
        stats["negatives"] += len(negatives)
        mined.append(MinedQuery(query, [t for _, t in negatives], [i for i, _ in negatives]))
    return mined, stats


def _too_close(hit: Any, positive_score: float, relative_margin: float | None) -> bool:
    dense = getattr(hit.explanation, "dense_score", None)
    if not relative_margin or relative_margin <= 0 or dense is None:
        return False  # a BM25-only candidate ranked below the dense list's cut: not close in dense terms
    return dense > positive_score * (1.0 - relative_margin)


def _positive_scores(queries: list[JudgedQuery], query_vectors: np.ndarray, encoder: Any) -> list[float]:
    """Each query's best cosine to one of its judged positives (the guard's reference)."""
    texts = [p.text for q in queries for p in q.positives]
    vectors = encoder.embed(texts, normalize=True)
    scores, start = [], 0
    for query, vector in zip(queries, query_vectors, strict=True):
        block = vectors[start : start + len(query.positives)]
        start += len(query.positives)
        scores.append(float((block @ vector).max()))
    return scores


def training_rows(mined: list[MinedQuery], loss: str, seed: int) -> list[dict[str, Any]]:
    """``bce``: (query, passage, label) pairs, one per positive and per negative. ``mnrl``: (query, positive,
    negative_1..n) rows with n fixed, a short list topped up with other queries' negatives (random ones)."""
    if loss == "bce":
        rows = []
        for item in mined:
            rows += [
                {"query": item.query.text, "passage": p.text, "label": 1.0} for p in item.query.positives
            ]
            rows += [{"query": item.query.text, "passage": text, "label": 0.0} for text in item.negatives]
        random.Random(seed).shuffle(rows)
        return rows
    wanted = max((len(item.negatives) for item in mined), default=0)
    pool = [text for item in mined for text in item.negatives]
    rng = random.Random(seed)
    rows = []
    for item in mined:
        own = set(item.negatives) | {p.text for p in item.query.positives}
        for positive in item.query.positives:
            negatives = list(item.negatives)
            for candidate in rng.sample(pool, min(len(pool), 4 * wanted)):
                if len(negatives) >= wanted:
                    break
                if candidate not in own:
                    negatives.append(candidate)
            if len(negatives) < wanted:
                continue  # a corpus too small to fill the row: the trainer needs equal columns
            row = {"query": item.query.text, "positive": positive.text}
            row |= {f"negative_{n + 1}": text for n, text in enumerate(negatives)}
            rows.append(row)
    rng.shuffle(rows)
    return rows
