"""``cloze adapt --lexical-teacher-weight``: how good a ranker its hybrid teacher is, and what a run scores.

1. The teacher alone: the bundled encoder's cosine plus ``w`` times BM25 over the query's best BM25
   (``encoder_training.adaptation.lexical_teacher``), whole documents at the contrastive stage's 256-token
   window, scored by nDCG@10 on SciFact's **train** queries for each ``w`` (the split defaults may be chosen
   on). This picked the weight the runs use.
2. With ``--run OUT`` (a finished ``cloze adapt ... --keep-work`` run), that run's SciFact train and test
   dense / hybrid and STS-B, plus its kept un-interpolated encoder re-blended at ``--reblend`` weights
   (train only), through the ``cloze eval`` commands.

    python benchmarks/adapt_lexical_teacher.py --run runs/adapt-60/scifact-lexical --reblend 0.5

Each part and each run keeps the command that made it; ``--name`` keys a rerun of the same folder apart.

Writes ``benchmarks/results/adapt_lexical_teacher.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.adapt import RESULTS, SCIFACT  # noqa: E402
from benchmarks.adapt_guard_sweep import score_run  # noqa: E402
from benchmarks.provenance import command, load_average  # noqa: E402

WINDOW = 256  # the contrastive stage's max_seq_length, at which the teacher embeds its texts


def teacher_scores(split: str, weights: list[float]) -> dict:
    """nDCG@10 of cosine + w * normalised BM25 on SciFact ``split``, per weight (100: nearly BM25 alone)."""
    from sentence_transformers import SentenceTransformer

    from encoder_runtime.model_dir import resolve_model_path
    from encoder_training.adaptation.corpus import read_passages
    from encoder_training.adaptation.lexical_teacher import Bm25Matrix
    from encoder_training.evaluation.beir import corpus_file, load_qrels, load_queries, ndcg_at

    started = time.perf_counter()
    passages = read_passages(corpus_file(SCIFACT))
    qrels = load_qrels(SCIFACT, split)
    queries = [(q, text) for q, text in load_queries(SCIFACT).items() if q in qrels]
    bm25 = Bm25Matrix([p.text for p in passages])
    lexical = (bm25.anchors([text for _, text in queries]) @ bm25.passages.T).toarray()
    lexical /= np.maximum(lexical.max(axis=1, keepdims=True), 1e-9)
    model = SentenceTransformer(str(resolve_model_path("")), local_files_only=True, device="cpu")
    model.max_seq_length = WINDOW
    documents = model.encode([p.text for p in passages], batch_size=64, normalize_embeddings=True)
    cosines = model.encode([text for _, text in queries], normalize_embeddings=True) @ documents.T
    ids = [p.id for p in passages]
    scores = {}
    for weight in weights:
        top = np.argsort(-(cosines + weight * lexical), axis=1)[:, :10]
        ndcg = [
            ndcg_at([ids[j] for j in row], qrels[q], 10) for row, (q, _) in zip(top, queries, strict=True)
        ]
        scores[str(weight)] = round(float(np.mean(ndcg)), 4)
    return {"split": split, "queries": len(queries), "ndcg@10": scores,
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=float, nargs="+", default=[0, 0.1, 0.2, 0.3, 0.5, 1.0, 100.0])
    parser.add_argument("--split", default="train")
    parser.add_argument("--run", type=Path, help="a finished cloze adapt run (with --keep-work) to score")
    parser.add_argument("--reblend", type=float, nargs="*", default=[])
    parser.add_argument("--name", help="the run's key in --out (default: the --run folder's name)")
    parser.add_argument("--no-teacher", action="store_true", help="skip part 1, keep its figures in --out")
    parser.add_argument("--out", type=Path, default=RESULTS / "adapt_lexical_teacher.json")
    args = parser.parse_args()
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    invocation = command()
    if not args.no_teacher:
        result["teacher"] = teacher_scores(args.split, args.weights) | {
            "load": load_average()[0],
            "command": invocation,
        }
        print(json.dumps(result["teacher"]), flush=True)
    if args.run:  # one entry per run, so a later run of the same recipe sits beside the earlier one
        log = args.run.with_name(args.run.name + ".eval.log")
        scores = score_run(args.run, args.reblend, log) | {"command": invocation}
        result["runs"] = result.get("runs", {}) | {args.name or args.run.name: scores}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
