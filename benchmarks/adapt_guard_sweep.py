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

from benchmarks.adapt import MSMARCO, RESULTS, SCIFACT, beir, load  # noqa: E402


def interpolated(work: Path, weight: float, out: Path) -> Path:
    """``work``'s contrastive encoder blended with the run's starting model at ``weight`` (cached in ``out``)."""
    if (out / "config.json").is_file():
        return out
    from sentence_transformers import SentenceTransformer

    from encoder_training.adaptation.run import RECORD, save_blended

    finished = work.with_name(work.name.removesuffix(".work"))
    start = Path(json.loads((finished / RECORD).read_text())["base_model"])
    model = SentenceTransformer(str(work / "contrastive" / "model"), local_files_only=True, device="cpu")
    save_blended(model, start, weight, out)
    return out


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
            "load": load(),
        }
        print(weight, rows[str(weight)], flush=True)
    result = {"command": "python benchmarks/adapt_guard_sweep.py " + " ".join(sys.argv[1:]), "rows": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
