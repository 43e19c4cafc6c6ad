"""Score finished ``cloze adapt ... --keep-work`` runs: SciFact train and test dense / hybrid and STS-B,
optionally their kept un-interpolated encoders re-blended at other weights (train only).

The one-run experiments of docs/adapt.md that need no scoring of their own (a recipe option against the
default) use this; the option's effect is read on **train**, test is reported and chooses nothing.

    python benchmarks/adapt_score_run.py runs/adapt-60/scifact-no-negatives \\
        --out benchmarks/results/adapt_no_negatives_distill.json

Writes ``--out`` (one entry a run, kept beside entries already there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.adapt_guard_sweep import score_run  # noqa: E402
from benchmarks.provenance import command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="finished cloze adapt output folders")
    parser.add_argument("--reblend", type=float, nargs="*", default=[], help="other blend weights")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    invocation = command()
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for run in args.runs:
        log = run.with_name(run.name + ".eval.log")
        result[run.name] = score_run(run, args.reblend, log) | {"command": invocation}
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({run.name: result[run.name]}), flush=True)


if __name__ == "__main__":
    main()
