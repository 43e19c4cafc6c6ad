"""``cloze adapt --mlm-distill-weight``: does the guarded MLM stage keep the encoder where plain MLM moves it?

1. The MLM stage alone, side by side: each ``--mlm NAME=RUN`` names a finished ``cloze adapt ... --keep-work``
   run whose kept MLM-stage encoder (``RUN.work/mlm/model``) is blended with the bundled model at the
   default interpolation (0.25) and scored on SciFact's **train** queries (the split defaults may be
   chosen on), dense and hybrid, all in this one invocation.
2. With ``--run RUN``, that whole run: SciFact train and test dense / hybrid and STS-B
   (``adapt_guard_sweep.score_run``).

    python benchmarks/adapt_mlm_guard.py --run runs/adapt-60/scifact-mlm-guard \\
        --mlm guarded=runs/adapt-60/scifact-mlm-guard plain=runs/adapt-60/scifact-lexical-3

Writes ``benchmarks/results/adapt_mlm_guard.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.adapt import RESULTS, SCIFACT, beir  # noqa: E402
from benchmarks.adapt_guard_sweep import interpolated, score_run  # noqa: E402
from benchmarks.provenance import command, load_average  # noqa: E402

INTERPOLATE = 0.25  # the recipe's default blend


def mlm_stage_scores(run: Path, log: Path) -> dict:
    work = run.with_name(run.name + ".work")
    record = json.loads((work / "state.json").read_text())["records"]["mlm"]
    blended = interpolated(work, INTERPOLATE, run.with_name(f"{run.name}-mlm-w{INTERPOLATE}"), stage="mlm")
    return {
        "run": str(run),
        "mlm_record": record,
        "scifact_train": {
            m: beir(str(blended), SCIFACT, m, "train", "torch", log) for m in ("dense", "hybrid")
        },
        "load": load_average()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mlm", nargs="*", default=[], metavar="NAME=RUN", help="runs whose MLM stage to score"
    )
    parser.add_argument(
        "--run", type=Path, help="a finished cloze adapt run (with --keep-work) to score whole"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "adapt_mlm_guard.json")
    args = parser.parse_args()
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    invocation = command()
    if args.mlm:
        stages = {}
        for entry in args.mlm:
            name, _, run = entry.partition("=")
            run_path = Path(run)
            stages[name] = mlm_stage_scores(run_path, run_path.with_name(run_path.name + ".eval.log"))
            print(json.dumps({name: stages[name]}), flush=True)
        result["mlm_stage"] = stages | {"interpolate": INTERPOLATE, "command": invocation}
    if args.run:
        log = args.run.with_name(args.run.name + ".eval.log")
        result["runs"] = result.get("runs", {}) | {
            args.run.name: score_run(args.run, [], log) | {"command": invocation}
        }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
