"""How many padded tokens one CPU forward pass should hold: throughput and memory per batch budget.

Offline ``load_encoder(backend, max_batch_tokens=B).embed(texts)`` on two real text sets: 2,000 distinct
sentences (STS-B and SciFact, the set of benchmarks/http_throughput.py: one-sentence requests) and 600
SciFact documents (title and abstract, most cut at the 256-token window: an index build). The budgets run
in turn, three rounds, so each is measured beside the others (the machine is shared); the median of the
rounds is reported. Memory: per budget, a fresh process embeds the documents and reports how far its peak
RSS rose above the loaded model (ONNX Runtime's arena keeps what its largest pass needed).

    .venv/bin/python benchmarks/batch_budget.py [--backends onnx-int8,onnx,torch] [--budgets 512,1024,2048,8192]

Writes ``benchmarks/results/batch_budget.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.http_throughput import distinct_sentences  # noqa: E402
from benchmarks.int8_calibration import corpus_texts  # noqa: E402
from benchmarks.provenance import command, load_average  # noqa: E402
from encoder_runtime import load_encoder  # noqa: E402

ROUNDS = 3
DOCUMENTS = 600


def status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def memory_growth(backend: str, budget: int) -> dict:
    """Run in a child process: peak RSS above the loaded model while it embeds the documents."""
    encoder = load_encoder(backend=backend, max_batch_tokens=budget)
    loaded = status_mb("VmRSS")
    encoder.embed(corpus_texts("beir-scifact", DOCUMENTS))
    return {"loaded_mb": round(loaded, 1), "peak_growth_mb": round(status_mb("VmHWM") - loaded, 1)}


def rates(backend: str, budgets: list[int], sets: dict[str, list[str]]) -> dict:
    encoders = {budget: load_encoder(backend=backend, max_batch_tokens=budget) for budget in budgets}
    runs: dict[int, dict[str, list[float]]] = {b: {name: [] for name in sets} for b in budgets}
    for _ in range(ROUNDS):
        for budget, encoder in encoders.items():
            for name, texts in sets.items():
                started = time.perf_counter()
                encoder.embed(texts)
                runs[budget][name].append(len(texts) / (time.perf_counter() - started))
    return {
        str(budget): {
            f"{name}_per_s": round(statistics.median(values), 1) for name, values in per_set.items()
        }
        | {"runs": {name: [round(v, 1) for v in values] for name, values in per_set.items()}}
        for budget, per_set in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="onnx-int8,onnx,torch")
    parser.add_argument("--budgets", default="512,1024,2048,8192")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/batch_budget.json")
    parser.add_argument("--memory-child", nargs=2, metavar=("BACKEND", "BUDGET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_growth(args.memory_child[0], int(args.memory_child[1]))))
        return
    budgets = [int(b) for b in args.budgets.split(",")]
    sets = {"sentences": distinct_sentences(2000), "documents": corpus_texts("beir-scifact", DOCUMENTS)}
    result: dict = {
        "command": command(),
        "cores": os.cpu_count(),
        "texts": {name: len(texts) for name, texts in sets.items()},
        "rounds": ROUNDS,
        "load_before": load_average(),
        "backends": {},
    }
    for backend in args.backends.split(","):
        per_budget = rates(backend, budgets, sets)
        for budget in budgets:
            child = [sys.executable, __file__, "--memory-child", backend, str(budget)]
            reply = subprocess.run(child, check=True, capture_output=True, text=True).stdout
            per_budget[str(budget)].update(json.loads(reply.strip().splitlines()[-1]))
            print(
                backend, budget, {k: v for k, v in per_budget[str(budget)].items() if k != "runs"}, flush=True
            )
        result["backends"][backend] = per_budget
    result["load_after"] = load_average()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
