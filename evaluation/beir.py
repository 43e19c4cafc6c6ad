"""BEIR-layout retrieval evaluation: nDCG@10, Recall@100, MRR@10 over an index built (or reused) for the folder.

Metrics follow BEIR / ``pytrec_eval`` conventions: linear gains, ideal DCG from the judged documents,
only relevance > 0 counts as relevant, and a result whose id equals the query id is dropped (BEIR's
``ignore_identical_ids``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from index.build.builder import BuildOptions, build_if_needed
from index.query.ranking import Fusion
from index.search_index import SearchIndex


def corpus_file(folder: Path) -> Path:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"no corpus.jsonl(.gz) in {folder}")


def load_queries(folder: Path) -> dict[str, str]:
    queries = {}
    with (folder / "queries.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                queries[str(record["_id"])] = record["text"]
    return queries


def load_qrels(folder: Path, split: str = "test") -> dict[str, dict[str, int]]:
    """query id -> {doc id: relevance}; header optional (some exports omit it), tab-separated."""
    qrels: dict[str, dict[str, int]] = {}
    with (folder / "qrels" / f"{split}.tsv").open(encoding="utf-8", newline="") as handle:
        for row in csv.reader(handle, delimiter="\t"):
            if len(row) < 3 or not row[-1].strip().lstrip("-").isdigit():
                continue  # header or blank
            query, doc, score = row[0].strip(), row[-2].strip(), int(row[-1])
            qrels.setdefault(query, {})[doc] = score
    return qrels


def ndcg_at(ranked: list[str], relevant: dict[str, int], k: int) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: list[str], relevant: dict[str, int], k: int) -> float:
    wanted = {doc for doc, g in relevant.items() if g > 0}
    return len(wanted.intersection(ranked[:k])) / len(wanted) if wanted else 0.0


def mrr_at(ranked: list[str], relevant: dict[str, int], k: int) -> float:
    for rank, doc in enumerate(ranked[:k], start=1):
        if relevant.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


def score_run(run: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    judged = [q for q in qrels if q in run]
    if not judged:
        raise ValueError("no judged query was run")
    return {
        "ndcg@10": float(np.mean([ndcg_at(run[q], qrels[q], 10) for q in judged])),
        "recall@100": float(np.mean([recall_at(run[q], qrels[q], 100) for q in judged])),
        "mrr@10": float(np.mean([mrr_at(run[q], qrels[q], 10) for q in judged])),
    }


def default_index_dir(data: Path, encoder: Any, backend: str) -> Path:
    """A cached index per data set, model and backend; ONNX ones also per export recipe, since a new recipe
    (calibrated int8, say) makes other vectors from the same model."""
    from encoder_runtime.backends.onnx_export import EXPORTER

    cache = Path(os.environ.get("CLOZE_CACHE_DIR", Path.home() / ".cache" / "cloze-search"))
    recipe = f"-x{EXPORTER}" if backend.startswith("onnx") else ""
    return cache / "beir" / f"{data.resolve().name}-{encoder.info.fingerprint[:12]}-{backend}{recipe}"


def evaluate_beir(
    data: Path,
    encoder: Any,
    mode: str,
    backend: str,
    index_dir: Path | None = None,
    split: str = "test",
    show_progress: bool = True,
    fusion: Fusion | None = None,
) -> dict[str, Any]:
    """One run: ``evaluate_beir_fusions`` with one fusion setting (hybrid's default when None)."""
    fusions = [fusion] if fusion is not None else None
    return evaluate_beir_fusions(data, encoder, mode, backend, index_dir, split, show_progress, fusions)[0]


def evaluate_beir_fusions(
    data: Path,
    encoder: Any,
    mode: str,
    backend: str,
    index_dir: Path | None = None,
    split: str = "test",
    show_progress: bool = True,
    fusions: list[Fusion] | None = None,
    top_k: int = 101,
) -> list[dict[str, Any]]:
    """Build (or reuse, when input and model are unchanged) the folder's index, run the judged queries, score:
    one result per fusion setting (hybrid; one run with the default otherwise), over one index, one set of
    query vectors and one in-memory BM25. ``top_k``: hits asked a query (101 leaves room for the dropped
    identical id); 10 scores the ranking a served top-10 search returns, since hybrid fuses a pool of
    max(30, 3 x top_k) and a convex fusion's normalisation depends on it. Each setting after the first is
    compared with the first, query by query (``paired_vs_first``)."""
    data = Path(data)
    index_dir = index_dir or default_index_dir(data, encoder, backend)
    build_if_needed(index_dir, corpus_file(data), encoder, BuildOptions(show_progress=show_progress))
    qrels = load_qrels(data, split)
    queries = {q: text for q, text in load_queries(data).items() if q in qrels}
    started = time.perf_counter()
    ids = list(queries)
    vectors = (
        encoder.embed([queries[q] for q in ids], normalize=True) if mode != "bm25" else [None] * len(ids)
    )
    embed_seconds = time.perf_counter() - started
    settings = (fusions or [Fusion()]) if mode == "hybrid" else [None]
    results: list[dict[str, Any]] = []
    per_query: dict[int, np.ndarray] = {}
    index = SearchIndex.open(index_dir, encoder, create=False)
    try:
        index.wait_for_lexical()
        manifest = index.manifest
        for fusion in settings:
            started = time.perf_counter()
            run = {}
            for query_id, vector in zip(ids, vectors, strict=True):
                hits = index.search(vector, queries[query_id], top_k=top_k, mode=mode, fusion=fusion)  # type: ignore[arg-type]
                run[query_id] = [h.id for h in hits if h.id != query_id][:100]
            seconds = embed_seconds + time.perf_counter() - started
            per_query[id(fusion)] = ndcg_per_query(run, qrels)
            results.append(
                score_run(run, qrels)
                | {
                    "mode": mode,
                    "fusion": _fusion_record(fusion),
                    "split": split,
                    "top_k": top_k,
                    "backend": backend,
                    "queries": len(run),
                    "data": str(data),
                    "index": str(index_dir),
                    "factory": manifest["factory"],
                    "documents": manifest["documents"],
                    "chunks": manifest["chunks"],
                    "model_id": manifest["model_id"],
                    "queries_per_second": round(len(run) / seconds, 2),
                }
            )
    finally:
        index.close()
    first = per_query[id(settings[0])]
    for fusion, result in zip(settings[1:], results[1:], strict=True):
        result["paired_vs_first"] = paired_difference(per_query[id(fusion)], first)
    return results


def ndcg_per_query(run: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> np.ndarray:
    return np.array([ndcg_at(run[q], qrels[q], 10) for q in qrels if q in run])


def paired_difference(scores: np.ndarray, baseline: np.ndarray, rounds: int = 2000) -> dict[str, Any]:
    """nDCG@10 minus the baseline's over the same queries: the mean, a 95% paired-bootstrap interval (fixed
    seed) and how many queries went up or down; a gain whose interval holds 0 is a tie."""
    diff = scores - baseline
    rng = np.random.default_rng(0)
    means = diff[rng.integers(0, len(diff), (rounds, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "ndcg@10": round(float(diff.mean()), 4),
        "ci95": [round(float(low), 4), round(float(high), 4)],
        "better": int((diff > 0).sum()),
        "worse": int((diff < 0).sum()),
    }


def _fusion_record(fusion: Fusion | None) -> dict[str, Any] | None:
    """The setting as a request names it: each method with its own parameter only."""
    if fusion is None:
        return None
    if fusion.method == "convex":
        return {"method": "convex", "alpha": fusion.alpha}
    return {"method": "rrf", "k": fusion.k}
