"""A cross-encoder as teacher (GPL's recipe; Wang et al. 2022): it scores the (anchor, positive, mined
negative) rows the corpus makes, and the student learns the teacher's margins with MarginMSE,
``sim(anchor, positive) - sim(anchor, negative)`` against ``CE(anchor, positive) - CE(anchor, negative)``.

The teacher's scores are its probabilities (``CrossEncoder.predict`` with the folder's own activation,
a sigmoid for a one-label reranker): margins within [-1, 1], the scale of the student's cosine margins.
Scoring a row costs two cross-encoder passes, so it stops when its share of the budget is spent; the rows
scored so far are cached in ``work/teacher_margins.jsonl`` (a resume does not score them again).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
MARGINS = "teacher_margins.jsonl"
CHUNK = 64  # rows scored between looks at the clock
MODES = ("beside", "instead")


def load_teacher(path: str | Path, max_length: int):
    from sentence_transformers import CrossEncoder

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"teacher not found: {path} (a sentence-transformers CrossEncoder folder)")
    return CrossEncoder(str(folder), device="cpu", max_length=max_length, local_files_only=True)


def negative_columns(train) -> list[str]:
    return [c for c in train.column_names if c.startswith("negative")]


def score_rows(teacher, train, seconds: float, work: Path):
    """``train``'s rows with a ``label`` column of teacher margins (one per negative), as many rows, in
    order, as ``seconds`` allows; rows cached in ``work`` count as scored already."""
    from datasets import Dataset

    cached = work / MARGINS
    rows = [json.loads(line) for line in cached.read_text().splitlines()] if cached.is_file() else []
    negatives = negative_columns(train)
    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    with cached.open("a") as handle:
        for begin in range(len(rows), len(train), CHUNK):
            if time.perf_counter() - started >= seconds:
                break
            chunk = train.select(range(begin, min(begin + CHUNK, len(train)))).to_list()
            for row in margins(teacher, chunk, negatives):
                handle.write(json.dumps(row) + "\n")
                rows.append(row)
    if not rows:
        raise ValueError("the teacher scored no row: raise --teacher-fraction or --max-time-minutes")
    return Dataset.from_list(rows)


def margins(teacher, rows: list[dict], negatives: list[str]) -> list[dict]:
    """Each row with ``label`` = [CE(anchor, positive) - CE(anchor, negative_i) for each negative]."""
    columns = ["positive", *negatives]
    pairs = [(row["anchor"], row[c]) for row in rows for c in columns]
    scores = np.asarray(teacher.predict(pairs, batch_size=32, show_progress_bar=False), dtype=float)
    scores = scores.reshape(len(rows), len(columns))
    return [
        {**{c: row[c] for c in ["anchor", *columns]}, "label": (s[0] - s[1:]).tolist()}
        for row, s in zip(rows, scores, strict=True)
    ]


def record(scored, total: int, seconds: float) -> dict:
    labels = np.array(scored["label"], dtype=float)
    return {
        "rows": len(scored),
        "of_rows": total,
        "seconds": round(seconds, 1),
        "mean_margin": round(float(labels.mean()), 4),
        "negative_above_positive": round(
            float((labels < 0).mean()), 4
        ),  # the teacher disagrees with the pair
    }
