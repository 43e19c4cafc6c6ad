"""Embedding throughput on 2,000 real sentences, every arm side by side in one run (the machine is noisy).

Offline sentences/s at batch 32: sentence-transformers ``encode`` (the baseline), then the runtime's torch,
ONNX fp32 and ONNX int8 backends; then the micro-batcher with 64 concurrent single-sentence callers,
against the same callers served one request per forward pass.

    .venv/bin/python benchmarks/embed_throughput.py [--sentences 2000] [--out benchmarks/results/embed_throughput.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
BATCH = 32
CALLERS = 64


def real_sentences(limit: int) -> list[str]:
    """Half STS-B test sentences (short), half sentences from SciFact abstracts (longer, technical)."""
    sts = []
    for line in (SHARED / "stsbenchmark" / "sts-test.csv").read_text().splitlines():
        sts += line.split("\t")[5:7]
    scifact = []
    with gzip.open(SHARED / "beir-scifact" / "corpus.jsonl.gz", "rt") as handle:
        for line in handle:
            scifact += [
                s for s in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]) if len(s.split()) >= 5
            ]
            if len(scifact) >= limit:
                break
    half = limit // 2
    return sts[:half] + scifact[: limit - half]


def timed(fn, *args) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - started, out


def concurrent_rate(runtime, sentences: list[str], max_batch_size: int) -> float:
    """Sentences/s for CALLERS concurrent callers, each sending one sentence at a time."""
    from encoder_runtime import MicroBatcher

    async def scenario() -> float:
        batcher = MicroBatcher.for_runtime(runtime, max_batch_size=max_batch_size)
        queue = list(sentences)

        async def caller() -> None:
            while queue:
                await batcher.submit([queue.pop()])

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(CALLERS)))
        elapsed = time.perf_counter() - started
        await batcher.stop()
        return len(sentences) / elapsed

    return asyncio.run(scenario())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "embed_throughput.json"))
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    from encoder_runtime import load_encoder
    from encoder_runtime.model_dir import bundled_model_path

    sentences = real_sentences(args.sentences)
    baseline_model = SentenceTransformer(str(bundled_model_path()), device="cpu")
    baseline_model.encode(sentences[:64], batch_size=BATCH)  # warm-up
    seconds, reference = timed(lambda: baseline_model.encode(sentences, batch_size=BATCH))
    rows = {
        "sentence-transformers (torch fp32)": {
            "sentences_per_s": len(sentences) / seconds,
            "cosine_mean": 1.0,
        }
    }
    runtimes = {}
    for backend in ("torch", "onnx", "onnx-int8"):
        runtime = load_encoder(backend=backend, max_batch_size=BATCH, max_batch_tokens=BATCH * 512)
        runtime.embed(sentences[:64])  # warm-up
        seconds, vectors = timed(runtime.embed, sentences)
        cosine = (vectors * reference).sum(axis=1)
        rows[f"runtime {backend}"] = {
            "sentences_per_s": len(sentences) / seconds,
            "cosine_mean": float(cosine.mean()),
            "cosine_min": float(cosine.min()),
        }
        runtimes[backend] = runtime
    for backend in ("onnx-int8", "torch"):
        runtime = runtimes[backend]
        rows[f"micro-batched {backend}, {CALLERS} callers"] = {
            "sentences_per_s": concurrent_rate(runtime, sentences, 64)
        }
        rows[f"one request per pass {backend}, {CALLERS} callers"] = {
            "sentences_per_s": concurrent_rate(runtime, sentences, 1)
        }
    report(rows, sentences, args.out)


def report(rows: dict, sentences: list[str], out: str) -> None:
    base = rows["sentence-transformers (torch fp32)"]["sentences_per_s"]
    for row in rows.values():
        row["x_baseline"] = row["sentences_per_s"] / base
    ratios = {
        "int8_vs_sentence_transformers": rows["runtime onnx-int8"]["x_baseline"],
        "microbatched_vs_offline_int8": rows[f"micro-batched onnx-int8, {CALLERS} callers"]["sentences_per_s"]
        / rows["runtime onnx-int8"]["sentences_per_s"],
        "microbatched_vs_one_per_pass_int8": rows[f"micro-batched onnx-int8, {CALLERS} callers"][
            "sentences_per_s"
        ]
        / rows[f"one request per pass onnx-int8, {CALLERS} callers"]["sentences_per_s"],
        "microbatched_vs_offline_torch": rows[f"micro-batched torch, {CALLERS} callers"]["sentences_per_s"]
        / rows["runtime torch"]["sentences_per_s"],
        "microbatched_vs_one_per_pass_torch": rows[f"micro-batched torch, {CALLERS} callers"][
            "sentences_per_s"
        ]
        / rows[f"one request per pass torch, {CALLERS} callers"]["sentences_per_s"],
    }
    result = {
        "command": command(),
        "sentences": len(sentences),
        "mean_words": float(np.mean([len(s.split()) for s in sentences])),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rows": rows,
        "ratios": ratios,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(f"{'arm':48s} {'sent/s':>9s} {'x base':>7s} {'cos':>7s}")
    for name, row in rows.items():
        cosine = f"{row['cosine_mean']:.4f}" if "cosine_mean" in row else ""
        print(f"{name:48s} {row['sentences_per_s']:9.1f} {row['x_baseline']:7.2f} {cosine:>7s}")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
