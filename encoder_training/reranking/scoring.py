"""Reranking a first stage's candidates with a cross-encoder, and scoring the result: shared by the training
command's dev check and ``benchmarks/rerank.py``. A scorer is any function from (query, passage) pairs to
scores, so a torch ``CrossEncoder`` and an ONNX session are measured by the same code."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from evaluation.beir import ndcg_at

Scorer = Callable[[list[tuple[str, str]]], np.ndarray]
Candidates = list[tuple[str, str]]  # (doc id, text), first-stage order


def cross_encoder_scorer(model: Any, batch_size: int = 32) -> Scorer:
    """Raw logits (no sigmoid): the order is the same and nothing saturates."""

    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        return np.asarray(
            model.predict(pairs, batch_size=batch_size, activation_fn=_identity, show_progress_bar=False),
            dtype=np.float32,
        ).reshape(-1)

    return score


def _identity(x):
    return x


def rerank(scorer: Scorer, query: str, candidates: Candidates, depth: int) -> list[str]:
    """The top ``depth`` candidates in the cross-encoder's order, the rest after them in first-stage order."""
    head, tail = candidates[:depth], candidates[depth:]
    scores = scorer([(query, text) for _, text in head])
    order = np.argsort(-scores, kind="stable")
    return [head[i][0] for i in order] + [doc for doc, _ in tail]


def mean_ndcg(runs: dict[str, Sequence[str]], relevant: dict[str, dict[str, int]], k: int = 10) -> float:
    return float(np.mean([ndcg_at(list(runs[q]), relevant[q], k) for q in runs])) if runs else 0.0
