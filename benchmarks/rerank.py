"""A cross-encoder reranker trained by ``cloze train reranker`` on SciFact's *train* queries, scored on SciFact
*test* and, unchanged, on the MS MARCO subset (it saw no MS MARCO): first stage alone against its top N
candidates reranked, for hybrid and dense first stages, on the torch (fp32) model and on ONNX files.

    python benchmarks/rerank.py --train-minutes 60 --model runs/rerank-scifact
    python benchmarks/rerank.py --model DIR --onnx DIR/onnx/rerank_int8.onnx --backend-label onnx-int8
    python benchmarks/rerank.py --model DIR --latency   # /search with and without rerank, under wrk

Training runs only when ``--model`` holds no finished run (``training.json``), as a real ``cloze train
reranker`` command in its own process; its settings are chosen on the train split (its dev check holds out
train queries), never on test. Scores are cached per (query, document) in ``--work`` and the result file is
rewritten after every row, so a rerun (or a second invocation for another backend) scores only what is
missing and adds its rows to ``benchmarks/results/rerank.json``. ``--rows`` can score a cheaper depth
first: on a loaded 2-core machine a depth of 50 over SciFact's 300 test queries is 15,000 pairs.

``--latency`` serves the SciFact index with the model as ``CLOZE_RERANK_MODELS`` (the service's default
backend: ONNX int8 when the folder was exported) and drives ``POST /search`` (hybrid, top 10) with Debian's
``wrk`` at one connection and at sixteen, without rerank and with ``rerank: {"candidates": N}``, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402

DATA = Path(os.environ.get("CLOZE_DATA_DIR", ROOT.parent / "shared" / "data"))
RESULTS = ROOT / "benchmarks" / "results"
SETS = {"scifact": DATA / "beir-scifact", "msmarco": DATA / "beir-msmarco-subset"}
DEV = "scifact-dev"  # the train queries `cloze train reranker` held out (its OUT.work/mined.json)


def train(model: Path, minutes: float, extra: list[str], log: Path) -> None:
    if (model / "training.json").is_file():
        return
    # --force: what a CPU budget buys is the measurement, even under one epoch
    args = [
        sys.executable, "-m", "app.cli", "train", "reranker", "--beir", str(SETS["scifact"]), "--split", "train",
        "--out", str(model), "--max-time-minutes", str(minutes), "--force", *extra,
    ]  # fmt: skip
    print("$", " ".join(args[2:]), flush=True)
    with log.open("a") as handle:
        done = subprocess.run(args, cwd=ROOT, stdout=handle, stderr=handle)
    if done.returncode:
        raise SystemExit(f"training failed ({done.returncode}); see {log}")


def first_stage_runs(data: Path, mode: str, depth: int) -> tuple[dict, dict, dict, dict]:
    """The test queries' first-stage top 100 (ids and texts), over the index ``cloze eval beir`` caches for the
    bundled encoder on the service's default backend."""
    from encoder_runtime import load_encoder
    from encoder_training.reranking.mining import first_stage
    from evaluation.beir import load_qrels, load_queries
    from index.search_index import SearchIndex

    encoder = load_encoder(None, backend="auto")
    index_dir = first_stage_index(data, encoder)
    qrels = load_qrels(data, "test")
    queries = {q: text for q, text in load_queries(data).items() if q in qrels}
    index = SearchIndex.open(index_dir, encoder, create=False, read_only=True)
    try:
        index.wait_for_lexical()
        hits, _ = first_stage(index, encoder, list(queries.values()), max(100, depth), mode)
    finally:
        index.close()
    candidates = {
        q: [(h.id, h.text) for h in hs if h.id != q] for q, hs in zip(queries, hits, strict=True)
    }  # BEIR's ignore_identical_ids
    info = {"first_stage_backend": encoder.backend.name, "index": str(index_dir)}
    return queries, qrels, candidates, info


class ScoreCache:
    """Scores per (query id, document id) for one model and backend, on disk: reruns score only what is new."""

    def __init__(self, path: Path, scorer):
        self.path, self.scorer = path, scorer
        self.scores: dict[str, float] = json.loads(path.read_text()) if path.is_file() else {}
        self.new = 0

    def score(self, query_id: str, query: str, candidates: list[tuple[str, str]]) -> np.ndarray:
        keys = [f"{query_id}\t{doc}" for doc, _ in candidates]
        missing = [
            (key, (query, text))
            for key, (_, text) in zip(keys, candidates, strict=True)
            if key not in self.scores
        ]
        if missing:
            values = self.scorer([pair for _, pair in missing])
            self.scores.update({key: float(v) for (key, _), v in zip(missing, values, strict=True)})
            self.new += len(missing)
            if self.new >= 200:
                self.save()
        return np.array([self.scores[k] for k in keys], dtype=np.float32)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.scores))
        self.new = 0


def onnx_scorer(onnx_file: Path, model_dir: Path, max_length: int, batch_size: int = 32):
    """The thin path for an exported cross-encoder: its tokenizer, ONNX Runtime, the one logit."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        out = []
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            encoded = tokenizer(
                [q for q, _ in chunk], [p for _, p in chunk], padding=True, truncation=True,
                max_length=max_length, return_tensors="np",
            )  # fmt: skip
            feed = {k: v.astype(np.int64) for k, v in encoded.items() if k in names}
            out.append(session.run(None, feed)[0].reshape(-1))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    return score


def scorer_for(args: argparse.Namespace, max_length: int):
    if args.onnx:
        return onnx_scorer(args.onnx, args.model, max_length)
    from sentence_transformers.cross_encoder import CrossEncoder

    from encoder_training.reranking.scoring import cross_encoder_scorer

    return cross_encoder_scorer(CrossEncoder(str(args.model), local_files_only=True), batch_size=32)


BLEND_WEIGHTS = tuple(round(w / 10, 1) for w in range(11))


def blended_order(scores: np.ndarray, weight: float, k: int = 60) -> np.ndarray:
    """Positions in the order of a weighted reciprocal-rank fusion of the reranker's ranking (``weight``) and
    the first stage's (the candidates' own order): 1.0 is the reranker alone, 0.0 the first stage."""
    rerank_rank = np.empty(len(scores), dtype=np.int64)
    rerank_rank[np.argsort(-scores, kind="stable")] = np.arange(1, len(scores) + 1)
    fused = weight / (k + rerank_rank) + (1 - weight) / (k + np.arange(1, len(scores) + 1))
    return np.argsort(-fused, kind="stable")


def rerank_row(cache: ScoreCache, dataset: str, queries, qrels, candidates, depth: int) -> dict[str, Any]:
    from evaluation.beir import ndcg_per_query, paired_difference, score_run

    started, pairs_before = time.perf_counter(), len(cache.scores)
    before = {q: [d for d, _ in candidates[q]][:100] for q in queries}
    runs: dict[float, dict[str, list[str]]] = {w: {} for w in BLEND_WEIGHTS}
    for q, text in queries.items():
        head, tail = candidates[q][:depth], [d for d, _ in candidates[q][depth:]]
        scores = cache.score(f"{dataset}/{q}", text, head)  # query ids of two sets may meet
        for weight, run in runs.items():
            run[q] = ([head[i][0] for i in blended_order(scores, weight)] + tail)[:100]
    cache.save()
    after = runs[1.0]
    first, reranked = score_run(before, qrels), score_run(after, qrels)
    return {
        "first_stage": {k: round(v, 4) for k, v in first.items()},
        "reranked": {k: round(v, 4) for k, v in reranked.items()},
        "paired_vs_first_stage": paired_difference(
            ndcg_per_query(after, qrels), ndcg_per_query(before, qrels)
        ),
        "blend_ndcg@10": {str(w): round(score_run(run, qrels)["ndcg@10"], 4) for w, run in runs.items()},
        "queries": len(after),
        "pairs_scored_now": len(cache.scores) - pairs_before,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="the CrossEncoder folder (trained if empty)"
    )
    parser.add_argument("--train-minutes", type=float, default=60.0)
    parser.add_argument("--train-args", default="", help="extra `cloze train reranker` options, one string")
    parser.add_argument("--onnx", type=Path, help="score this ONNX file instead of the torch model")
    parser.add_argument(
        "--backend-label", default=None, help="the rows' backend name (default: torch / onnx)"
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        default=[f"{d}:{m}:50" for d in SETS for m in ("hybrid", "dense")],
        help="DATASET:MODE:CANDIDATES, scored in this order (each row is written when done)",
    )
    parser.add_argument(
        "--latency", action="store_true", help="measure /search with and without rerank instead of rows"
    )
    parser.add_argument("--latency-candidates", type=int, default=50)
    parser.add_argument("--latency-seconds", type=int, default=40, help="wrk's duration per setting")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "rerank-benchmark")
    parser.add_argument("--out", type=Path, default=RESULTS / "rerank.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    train(args.model, args.train_minutes, args.train_args.split(), args.work / "train.log")
    record = json.loads((args.model / "training.json").read_text())
    if args.latency:
        result = json.loads(args.out.read_text()) if args.out.is_file() else {"model": str(args.model)}
        result["latency"] = latency(args.model, args.latency_candidates, args.latency_seconds, args.work)
        result["latency"]["command"] = command()
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written: {args.out}")
        return
    backend = args.backend_label or ("onnx" if args.onnx else "torch")
    cache = ScoreCache(
        args.work / f"scores-{args.model.name}-{backend}.json",
        scorer_for(args, record["recipe"]["max_length"]),
    )
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if result.get("model") != str(args.model):
        result = {"model": str(args.model), "rows": []}
    result |= {"training": summary(record), "commands": sorted(set(result.get("commands", [])) | {command()})}
    result.setdefault("load_average_1min_samples", []).append(load_average()[0])
    for spec in args.rows:
        dataset, mode, depth = parse_row(spec)
        if dataset == DEV:
            queries, qrels, candidates, info = dev_runs(args.model, depth)
        else:
            queries, qrels, candidates, info = first_stage_runs(SETS[dataset], mode, depth)
        row = {"dataset": dataset, "mode": mode, "candidates": depth, "backend": backend, **info}
        row |= rerank_row(cache, dataset, queries, qrels, candidates, depth)
        key = (dataset, mode, depth, backend)
        result["rows"] = [
            r for r in result["rows"] if (r["dataset"], r["mode"], r["candidates"], r["backend"]) != key
        ]
        result["rows"].append(row)
        result["load_average_1min_samples"].append(load_average()[0])
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(
            f"{dataset:8} {mode:6} top {depth:3} {backend:10} nDCG@10 {row['first_stage']['ndcg@10']:.4f} -> "
            f"{row['reranked']['ndcg@10']:.4f}  ({row['pairs_scored_now']} pairs, {row['seconds']} s)",
            flush=True,
        )
    result["wall_time_s_last_invocation"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.out}")


def latency(model: Path, candidates: int, seconds: int, work: Path) -> dict[str, Any]:
    """p50 / p99 of ``/search`` with and without rerank, one server, the arms interleaved per concurrency."""
    from benchmarks.http_throughput import LUA, write_bodies, wrk
    from evaluation.beir import load_qrels, load_queries
    from harness.servers import serve_process

    index = first_stage_index(SETS["scifact"])
    qrels = load_qrels(SETS["scifact"], "test")
    texts = [text for q, text in load_queries(SETS["scifact"]).items() if q in qrels]
    plain = {"mode": "hybrid", "top_k": 10}
    arms = {
        "hybrid": write_bodies(work, "plain", [{"query": t, **plain} for t in texts]),
        f"hybrid+rerank{candidates}": write_bodies(
            work, "rerank", [{"query": t, **plain, "rerank": {"candidates": candidates}} for t in texts]
        ),
    }
    script = work / "search.lua"
    script.write_text(LUA)
    env = {
        "CLOZE_INDEX": str(index),
        "CLOZE_RERANK_MODELS": f"default={model}",
        "CLOZE_LOG_LEVEL": "warning",
        "CLOZE_INDEX_READ_ONLY": "true",
    }
    rows = []
    with serve_process(env, work / "server.log", timeout=600) as (url, process):
        served = httpx.get(url + "/models", timeout=30).json()["rerank_models"]
        for body in arms.values():  # warm-up: the first requests load sessions and fill caches
            httpx.post(url + "/search", content=body.read_text().splitlines()[0], timeout=120,
                       headers={"Content-Type": "application/json"})  # fmt: skip
        for connections in (1, 16):
            for arm, bodies in arms.items():
                row = wrk(url, "/search", bodies, connections, seconds, script, process.pid, timeout="120s")
                rows.append({"arm": arm, "connections": connections, **row})
                print(
                    f"{arm:18} c={connections:<3} {row['requests_per_s']:6.1f} req/s  p50 {row['p50_ms']:8.1f} ms"
                    f"  p99 {row['p99_ms']:8.1f} ms  errors {row['errors_total']}  load {row['load'][0]}",
                    flush=True,
                )
    return {"reranker": served, "candidates": candidates, "seconds_per_setting": seconds, "rows": rows}


def first_stage_index(data: Path, encoder: Any = None) -> Path:
    """The index ``cloze eval beir`` caches for the bundled encoder on the service's default backend."""
    from encoder_runtime import load_encoder
    from evaluation.beir import corpus_file, default_index_dir
    from index.build.builder import BuildOptions, build_if_needed

    encoder = encoder or load_encoder(None, backend="auto")
    index_dir = default_index_dir(data, encoder, encoder.backend.name)
    build_if_needed(index_dir, corpus_file(data), encoder, BuildOptions(show_progress=False, resume=True))
    return index_dir


def dev_runs(model: Path, depth: int) -> tuple[dict, dict, dict, dict]:
    """The train queries the training held out as its dev set, with the hybrid candidates it stored: where a
    setting (the blend weight) is chosen, never on test."""
    prepared = json.loads((Path(f"{model}.work") / "mined.json").read_text())
    dev = prepared["dev"]
    if len(dev[0]["candidates"]) < depth:
        raise SystemExit(
            f"the dev set holds {len(dev[0]['candidates'])} candidates a query, fewer than {depth}"
        )
    queries = {f"dev{n}": item["query"] for n, item in enumerate(dev)}
    qrels = {f"dev{n}": item["relevant"] for n, item in enumerate(dev)}
    candidates = {f"dev{n}": [tuple(c) for c in item["candidates"]] for n, item in enumerate(dev)}
    info = {"first_stage_backend": prepared["record"]["first_stage"]["backend"], "index": "the training's"}
    return queries, qrels, candidates, info


def parse_row(spec: str) -> tuple[str, str, int]:
    dataset, mode, depth = spec.split(":")
    if (
        dataset not in (*SETS, DEV)
        or mode not in ("hybrid", "dense")
        or (dataset == DEV and mode != "hybrid")
    ):
        raise SystemExit(
            f"--rows {spec!r}: DATASET is one of {', '.join((*SETS, DEV))}, MODE hybrid or dense ({DEV}: hybrid)"
        )
    return dataset, mode, int(depth)


def summary(record: dict) -> dict:
    recipe, training = record["recipe"], record["training"]
    return {
        "recipe": {
            k: recipe[k]
            for k in (
                "loss",
                "num_negatives",
                "range_max",
                "relative_margin",
                "max_length",
                "batch_size",
                "learning_rate",
                "max_time_minutes",
                "dev_queries",
                "dev_candidates",
            )
        },
        "base_model": record["base_model"],
        "data": record["data"],
        "rows": record["rows"],
        "steps": training["steps"],
        "epochs": training["epochs"],
        "train_seconds": training["train_seconds"],
        "loss": [training.get("first_loss"), training.get("final_loss")],
        "dev": record["dev"],
    }


if __name__ == "__main__":
    main()
