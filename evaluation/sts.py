"""Semantic textual similarity: Spearman correlation between cosine similarity and human scores.

The model is embedded through the inference runtime (``encoder_runtime.load_encoder``), so the number
measured is the number the service would give, on whichever backend is asked for. STS-B test is
the headline; SICK-R and SemEval STS 2012-2016 are evaluation-only extras (STS-B is built from them,
so they are never training data here).
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from encoder_runtime import load_encoder

STS_DIR = "stsbenchmark"
EXTRA_DIR = "sts-eval-sick-semeval"


@dataclass(frozen=True)
class StsSet:
    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)


def _tsv(path: Path) -> Iterator[list[str]]:
    with path.open(encoding="utf-8-sig") as handle:
        yield from csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)


def _collect(name: str, triples: Iterator[tuple[str, str, str]], limit: int | None) -> StsSet:
    """Rows with an empty score are unannotated (SemEval 2015/2016) and dropped."""
    kept = [(a, b, float(s)) for a, b, s in triples if s.strip()]
    kept = kept[:limit] if limit else kept
    return StsSet(name, [a for a, _, _ in kept], [b for _, b, _ in kept], [s for _, _, s in kept])


def read_stsb(data: Path, split: str = "test", limit: int | None = None) -> StsSet:
    rows = ((f[5], f[6], f[4]) for f in _tsv(data / STS_DIR / f"sts-{split}.csv") if len(f) >= 7)
    return _collect(f"stsb-{split}", rows, limit)


def read_sick(data: Path, limit: int | None = None) -> StsSet:
    lines = itertools.islice(_tsv(data / EXTRA_DIR / "sick2014" / "SICK_test_annotated.txt"), 1, None)
    return _collect("sick-r", ((f[1], f[2], f[3]) for f in lines if len(f) >= 4), limit)


def read_semeval(data: Path, year: int, limit: int | None = None) -> StsSet:
    """All test files of one SemEval STS year, pooled (the "all" setting of SentEval)."""
    files = sorted((data / EXTRA_DIR / "semeval-sts" / str(year)).glob("*.test.tsv"))
    rows = ((f[1], f[2], f[0]) for path in files for f in _tsv(path) if len(f) >= 3)
    return _collect(f"sts{year % 100}", rows, limit)


def read_sets(data: Path, names: list[str], limit: int | None = None) -> list[StsSet]:
    """``stsb-test``, ``stsb-dev``, ``sick-r``, ``sts12`` .. ``sts16``, or ``all``."""
    if names == ["all"]:
        names = ["stsb-test", "sick-r", *(f"sts{year}" for year in range(12, 17))]
    sets = []
    for name in names:
        if name.startswith("stsb-"):
            sets.append(read_stsb(data, name.removeprefix("stsb-"), limit))
        elif name == "sick-r":
            sets.append(read_sick(data, limit))
        elif name.startswith("sts") and name[3:].isdigit():
            sets.append(read_semeval(data, 2000 + int(name[3:]), limit))
        else:
            raise ValueError(f"unknown STS set {name!r}")
    return sets


def spearman_of(embed, sts: StsSet) -> float:
    """Spearman of cosine similarity; ``embed`` maps texts to a float matrix (normalised or not)."""
    from scipy.stats import spearmanr

    first, second = embed(sts.sentences1), embed(sts.sentences2)
    first = first / np.maximum(np.linalg.norm(first, axis=1, keepdims=True), 1e-12)
    second = second / np.maximum(np.linalg.norm(second, axis=1, keepdims=True), 1e-12)
    cosine = (first * second).sum(axis=1)
    return float(spearmanr(cosine, sts.scores).statistic)


def evaluate_sts(
    model: str | Path | None,
    data: Path,
    sets: list[str] | None = None,
    backend: str = "torch",
    limit: int | None = None,
) -> dict:
    """Spearman per set; ``spearman`` and ``pairs`` describe the first set (STS-B test by default)."""

    runtime = load_encoder(str(model) if model else None, backend=backend)
    results = {
        s.name: {"spearman": spearman_of(runtime.embed, s), "pairs": len(s)}
        for s in read_sets(data, sets or ["stsb-test"], limit)
    }
    headline = next(iter(results.values()))
    return {
        "model": str(runtime.info.path),
        "model_id": runtime.info.model_id,
        "backend": backend,
        "spearman": headline["spearman"],
        "pairs": headline["pairs"],
        "sets": results,
    }
