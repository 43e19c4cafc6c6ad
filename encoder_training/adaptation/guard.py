"""The result check: ``cloze adapt`` never hands back an encoder that retrieves worse than the one it started
from, as far as pairs held out from its own corpus can tell.

A slice of the pairs the corpus makes (``guard_pairs``, at most a fifth) is set aside before mining and
never trained on. Each held-out anchor is a query whose one relevant passage is its own positive, ranked
among all the held-out positives (nDCG@10 and MRR@10; ties count against the encoder, so a collapsed one
scores nothing). With a cross-encoder teacher the check also asks the teacher: each anchor's positive and
the starting encoder's nearest held-out passages are graded by the teacher once, and an encoder's ranking
of those candidates is scored by nDCG@10 against the teacher's grades; the decision then uses the mean of
the two.

The decision: the configured blend (``--interpolate``) is kept when it beats the start; otherwise each other
blend weight of ``guard_alphas`` is scored and the best is kept if it beats the start; otherwise the starting
weights are kept and the console says so. ``training.json`` (and so the model card) records the check.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)
MIN_HELD_OUT = 4  # fewer held-out pairs than this make no ranking to speak of
TEACHER_CANDIDATES = (
    5  # per held-out anchor: its positive and the starting encoder's next nearest (cost: 5 pairs each)
)


@dataclass
class HeldOut:
    """Held-out anchors; ``passages[i]`` is ``queries[i]``'s positive. With a teacher, ``candidates[i]`` are
    passage numbers the teacher graded for query ``i`` (``grades[i]``, same order)."""

    queries: list[str]
    passages: list[str]
    candidates: list[list[int]] | None = None
    grades: list[list[float]] | None = None


def hold_out(
    pairs: list[dict[str, str]], wanted: int, seed: int
) -> tuple[list[dict[str, str]], HeldOut | None]:
    """(training pairs, held-out pairs): ``wanted`` pairs, at most a fifth, drawn at random and removed from
    training; ``None`` when that leaves fewer than ``MIN_HELD_OUT`` (the guard is then off)."""
    count = min(wanted, len(pairs) // 5)
    if count < MIN_HELD_OUT:
        return pairs, None
    chosen = set(random.Random(seed + 1).sample(range(len(pairs)), count))
    held = [pairs[i] for i in sorted(chosen)]
    train = [pair for i, pair in enumerate(pairs) if i not in chosen]
    return train, HeldOut([p["anchor"] for p in held], [p["positive"] for p in held])


def _embed(model, texts: list[str], max_seq_length: int) -> torch.Tensor:
    window = model.max_seq_length
    model.max_seq_length = max_seq_length
    try:
        vectors = model.encode(texts, batch_size=64, convert_to_tensor=True, show_progress_bar=False)
    finally:
        model.max_seq_length = window
    vectors = torch.nan_to_num(vectors.float().cpu(), nan=0.0)  # a diverged encoder scores nothing, not NaN
    return torch.nn.functional.normalize(vectors, dim=-1)


def similarities(model, held: HeldOut, max_seq_length: int) -> torch.Tensor:
    """(queries, passages) cosines of the held-out anchors against the held-out positives."""
    return _embed(model, held.queries, max_seq_length) @ _embed(model, held.passages, max_seq_length).T


def ndcg_of_rank(rank: torch.Tensor) -> torch.Tensor:
    """nDCG@10 of one relevant passage at 0-based ``rank``."""
    return torch.where(rank < 10, 1.0 / torch.log2(rank.float() + 2.0), torch.zeros(()))


def pair_scores(sims: torch.Tensor) -> dict[str, float]:
    """nDCG@10 and MRR@10 of each anchor's own positive; a passage scoring equal to it ranks above it."""
    own = sims.diagonal()
    rank = (sims >= own[:, None]).sum(1) - 1  # the others at or above the positive
    mrr = torch.where(rank < 10, 1.0 / (rank.float() + 1.0), torch.zeros(()))
    return {"ndcg@10": float(ndcg_of_rank(rank).mean()), "mrr@10": float(mrr.mean())}


def graded_ndcg(scores: list[float], grades: list[float], k: int = 10) -> float:
    """nDCG@k of ranking candidates by ``scores`` with ``grades`` as gains (ties ranked worst-first)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], grades[i]))
    dcg = sum(grades[i] / math.log2(rank + 2) for rank, i in enumerate(order[:k]))
    ideal = sum(g / math.log2(rank + 2) for rank, g in enumerate(sorted(grades, reverse=True)[:k]))
    return dcg / ideal if ideal > 0 else 0.0


def teacher_candidates(sims: torch.Tensor) -> list[list[int]]:
    """Each anchor's positive and the starting encoder's nearest other held-out passages."""
    count = min(TEACHER_CANDIDATES, sims.shape[1])
    candidates = []
    for row, scores in enumerate(sims):
        others = [int(i) for i in scores.argsort(descending=True) if int(i) != row][: count - 1]
        candidates.append([row, *others])
    return candidates


def judge(held: HeldOut, sims: torch.Tensor, teacher) -> None:
    """Grade each held-out anchor's candidates with the cross-encoder ``teacher`` (probabilities)."""
    held.candidates = teacher_candidates(sims)
    pairs = [(held.queries[q], held.passages[p]) for q, row in enumerate(held.candidates) for p in row]
    flat = np.asarray(teacher.predict(pairs, batch_size=32, show_progress_bar=False), dtype=float).ravel()
    width = len(held.candidates[0])
    held.grades = [flat[i : i + width].tolist() for i in range(0, len(flat), width)]


def score(model, held: HeldOut, max_seq_length: int) -> dict[str, float]:
    """The held-out scores of ``model``; ``decision`` is what the guard compares."""
    return score_from(similarities(model, held, max_seq_length), held)


def score_from(sims: torch.Tensor, held: HeldOut) -> dict[str, float]:
    result = pair_scores(sims)
    if held.grades is not None and held.candidates is not None:
        teacher = [
            graded_ndcg([float(sims[q, p]) for p in row], grades)
            for q, (row, grades) in enumerate(zip(held.candidates, held.grades, strict=True))
        ]
        result["teacher_ndcg@10"] = float(np.mean(teacher))
        result["decision"] = (result["ndcg@10"] + result["teacher_ndcg@10"]) / 2
    else:
        result["decision"] = result["ndcg@10"]
    return {k: round(v, 4) for k, v in result.items()}


def blend_states(start: dict, adapted: dict, weight: float) -> dict:
    """``weight`` * adapted + (1 - ``weight``) * start, tensor by tensor (integer buffers from ``adapted``)."""
    blended = {}
    for key, value in adapted.items():
        if key not in start or start[key].shape != value.shape:
            raise ValueError(f"cannot interpolate {key}: the starting model has no tensor of that shape")
        blended[key] = torch.lerp(start[key], value, weight) if value.is_floating_point() else value
    return blended


def choose(model, start_state: dict, held: HeldOut, start_score: dict, config) -> dict:
    """Load into ``model`` the weights the guard keeps and return the check's record."""
    adapted = {k: v.detach().clone() for k, v in model.state_dict().items()}
    weights = [config.interpolate] + sorted(
        {w for w in config.guard_alphas if w != config.interpolate}, reverse=True
    )
    tried: list[dict] = []
    for weight in weights:
        model.load_state_dict(blend_states(start_state, adapted, weight))
        tried.append({"alpha": weight, **score(model, held, config.max_seq_length)})
        if weight == config.interpolate and tried[-1]["decision"] > start_score["decision"]:
            break  # the configured blend beats the start: kept, no search
    best = max(tried, key=lambda entry: entry["decision"])
    if best["decision"] > start_score["decision"]:
        decision, alpha = ("adapted" if best["alpha"] == config.interpolate else "blend"), best["alpha"]
        model.load_state_dict(blend_states(start_state, adapted, alpha))
    else:
        decision, alpha = "start", 0.0
        model.load_state_dict(start_state)
    return {
        "held_out_pairs": len(held.queries),
        "metric": "mean of ndcg@10 and teacher_ndcg@10" if held.grades is not None else "ndcg@10",
        "start": start_score,
        "adapted": tried[0],
        "blends": tried[1:],
        "decision": decision,
        "alpha": alpha,
        "kept": best if decision != "start" else start_score,
    }


def sentence(record: dict) -> str:
    """What the console says about the check."""
    if record.get("decision") is None:
        return f"adaptation check: not run ({record.get('reason')})"
    start, adapted, pairs = (
        record["start"]["decision"],
        record["adapted"]["decision"],
        record["held_out_pairs"],
    )
    metric = record["metric"]
    head = f"adaptation check on {pairs} held-out pairs ({metric}): start {start}, adapted {adapted}"
    if record["decision"] == "adapted":
        return f"{head}; the adapted encoder beats the start and is kept (blend weight {record['alpha']})."
    if record["decision"] == "blend":
        return (
            f"{head}. The adapted encoder does not beat the starting one; the blend at weight "
            f"{record['alpha']} does ({record['kept']['decision']}) and is kept."
        )
    return (
        f"{head}. The adapted encoder does NOT beat the starting one, nor does any blend "
        f"({', '.join(str(b['alpha']) for b in record['blends']) or 'none tried'}): the starting weights are kept."
    )
