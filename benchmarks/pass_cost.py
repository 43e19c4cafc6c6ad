"""What one forward pass costs beyond its tokens, per backend: how much padding a batch could carry to save a pass.

For batches of ``rows`` texts padded to ``width`` tokens, each pass is timed by the CPU time of the thread
that runs it (the way the service runs passes on a CPU: one single-threaded pass per core). Per width, a line
fitted through the passes of 1, 2 and 4 rows gives a row's cost (its slope), a padded token's cost (that
over the width) and the pass's fixed cost (its intercept), which, stated in padded tokens, is the padding
worth carrying to save a pass. Texts are synthetic token ids: a pass's time does not depend on
which ids it reads.

    python benchmarks/pass_cost.py                      # onnx-int8, onnx, torch
    python benchmarks/pass_cost.py --backends onnx-int8

Writes ``benchmarks/results/pass_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import command, load_average  # noqa: E402
from encoder_runtime import load_encoder  # noqa: E402
from encoder_runtime.tokenization import Encoded  # noqa: E402

WIDTHS = (8, 16, 24, 32, 48, 64)
ROWS = (1, 2, 4, 8, 16)
FIT_ROWS = (1, 2, 4)
SHORT = 32  # the widths where a pass's fixed cost matters: one-sentence requests


def batch(rows: int, width: int) -> list[Encoded]:
    body = lambda row: [2000 + (row * 7 + j) % 5000 for j in range(width - 2)]  # noqa: E731
    return [Encoded(tuple([101, *body(row), 102]), False) for row in range(rows)]


def pass_us(encoder, rows: int, width: int, budget_s: float) -> float:
    """Median thread CPU time of one pass, over passes run for about ``budget_s``."""
    texts = batch(rows, width)
    encoder.run(texts)  # warm: first runs allocate
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.thread_time()
        encoder.run(texts)
        times.append((time.thread_time() - started) * 1e6)
    return statistics.median(times)


def measure(backend: str, budget_s: float) -> dict:
    encoder = load_encoder(backend=backend, threads=1)
    grid = {
        f"{rows}x{width}": round(pass_us(encoder, rows, width, budget_s), 1)
        for width in WIDTHS
        for rows in ROWS
    }
    derived = {}
    for width in WIDTHS:
        # cost = fixed + rows x row cost, fitted over the short batches (1, 2, 4 rows) the service runs
        rows = np.array(FIT_ROWS, dtype=float)
        costs = np.array([grid[f"{r}x{width}"] for r in FIT_ROWS])
        per_row, fixed = np.polyfit(rows, costs, 1)
        per_token = per_row / width
        derived[width] = {
            "row_us": round(float(per_row), 1),
            "padded_token_us": round(float(per_token), 2),
            "fixed_pass_us": round(float(fixed), 1),
            "fixed_pass_in_tokens": round(float(fixed / per_token), 1),
        }
    short = [derived[w]["fixed_pass_in_tokens"] for w in WIDTHS if w <= SHORT]
    return {
        "pass_us_by_rows_x_width": grid,
        "by_width": derived,
        "fixed_pass_in_tokens_median_up_to_32": statistics.median(short),
        "provider": encoder.backend.provider,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["onnx-int8", "onnx", "torch"])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per (rows, width) cell")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "pass_cost.json")
    args = parser.parse_args()
    result = {
        "command": command(),
        "model": "bundled all-MiniLM-L6-v2",
        "load_at_start": load_average(),
        "backends": {},
    }
    for backend in args.backends:
        result["backends"][backend] = entry = measure(backend, args.seconds)
        print(backend, "fixed cost of a pass, in padded tokens, by width:",
              {w: d["fixed_pass_in_tokens"] for w, d in entry["by_width"].items()})  # fmt: skip
    result["load_at_end"] = load_average()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
