"""The forgetting guard's weight, swept after the fact: ``cloze adapt`` keeps its un-interpolated encoder in
``OUT.work/contrastive/model`` (with ``--keep-work``), so other WiSE-FT weights need no retraining.

For each weight, the adapted encoders of a finished ``benchmarks/adapt.py`` run (SciFact and MS MARCO) are
interpolated with the bundled model and scored: SciFact on its **train** queries (the split allowed for
choosing defaults) and MS MARCO dense (the corpus the bundled model already knows, where the guard matters).

    python benchmarks/adapt_guard_sweep.py --work runs/adapt-60 --weights 0.25 0.5 1.0

Writes ``benchmarks/results/adapt_guard_sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.adapt import MSMARCO, RESULTS, SCIFACT, beir, stage_times, sts  # noqa: E402
from benchmarks.provenance import command, load_average  # noqa: E402


def interpolated(work: Path, weight: float, out: Path, stage: str = "contrastive") -> Path:
    """``work``'s encoder after ``stage`` blended with the run's starting model at ``weight`` (cached in ``out``)."""
    if (out / "config.json").is_file():
        return out
    from sentence_transformers import SentenceTransformer

    from encoder_training.adaptation.run import RECORD, save_blended

    finished = work.with_name(work.name.removesuffix(".work"))
    start = Path(json.loads((finished / RECORD).read_text())["base_model"])
    model = SentenceTransformer(str(work / stage / "model"), local_files_only=True, device="cpu")
    save_blended(model, start, weight, out)
    return out


def score_run(out: Path, reblend: list[float], log: Path) -> dict:
    """A finished ``cloze adapt ... --keep-work`` run: SciFact train and test dense / hybrid and STS-B, and
    its kept un-interpolated encoder re-blended at each ``reblend`` weight (train only)."""
    model = str(out)
    record = json.loads((out / "training.json").read_text())
    result = {
        "run": model,
        "recipe": record["recipe"],
        "stage_minutes": stage_times(record),
        "steps": record["steps"],
        "scifact_train": {m: beir(model, SCIFACT, m, "train", "torch", log) for m in ("dense", "hybrid")},
        "scifact_test": {m: beir(model, SCIFACT, m, "test", "torch", log) for m in ("dense", "hybrid")},
        "stsb_test": sts(model, log),
        "load": load_average()[0],
    }
    work = out.with_name(out.name + ".work")
    for weight in reblend:
        blended = str(interpolated(work, weight, out.with_name(f"{out.name}-w{weight}")))
        result[f"scifact_train_at_{weight}"] = {
            m: beir(blended, SCIFACT, m, "train", "torch", log) for m in ("dense", "hybrid")
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "adapt-60")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    parser.add_argument("--out", type=Path, default=RESULTS / "adapt_guard_sweep.json")
    args = parser.parse_args()
    log = args.work / "sweep.log"
    rows: dict[str, dict] = {"bundled": {
        "scifact_train_dense": beir("", SCIFACT, "dense", "train", "torch", log),
        "msmarco_dense": beir("", MSMARCO, "dense", "test", "torch", log),
    }}  # fmt: skip
    for weight in args.weights:
        scifact = interpolated(args.work / "scifact-both.work", weight, args.work / f"scifact-w{weight}")
        msmarco = interpolated(args.work / "msmarco-both.work", weight, args.work / f"msmarco-w{weight}")
        rows[str(weight)] = {
            "scifact_train_dense": beir(str(scifact), SCIFACT, "dense", "train", "torch", log),
            "scifact_train_hybrid": beir(str(scifact), SCIFACT, "hybrid", "train", "torch", log),
            "msmarco_dense": beir(str(msmarco), MSMARCO, "dense", "test", "torch", log),
            "load": load_average()[0],
        }
        print(weight, rows[str(weight)], flush=True)
    result = {"command": command(), "rows": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
