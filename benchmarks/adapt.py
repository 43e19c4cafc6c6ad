"""``cloze adapt`` on BEIR SciFact (corpus text only) and the MS MARCO subset, against the bundled model.

Every step is a real ``cloze`` command in its own process (adapt, eval beir, eval sts), so this measures
the product's commands. Finished steps are reused on a rerun (``--work``): an adapted folder with its
``training.json`` is not trained again, and ``cloze eval beir`` reuses an index built for the same model.

Variants (the ablation), all from the bundled all-MiniLM-L6-v2 under one budget of ``--minutes``:
- ``both``: the recipe as shipped (MLM stage, then contrastive with mined negatives, then interpolation);
- ``mlm-only``: the ``both`` run's MLM stage alone (its ``mlm_fraction`` of the budget), interpolated the same way;
- ``contrastive-only``: no MLM stage; the same mined pairs and the same contrastive time as ``both``;
- ``no-negatives``: ``both`` with in-batch negatives only (its MLM stage reused, no mining);
- ``no-distill`` (not run unless named): ``both`` without the distillation guard (``--distill-weight 0``),
  its mining and MLM stages reused;
- ``unguarded`` (not run unless named): ``both``'s trained encoder saved at the configured blend without the
  result check (``--guard-pairs 0``), every stage reused: what the check kept the user from;
- ``teacher`` (needs ``--teacher DIR``): ``both`` plus a cross-encoder teacher (``--teacher``, MarginMSE),
  its mining reused.

``both``'s ``guard`` entry is its result check (held-out scores of the start, the blends, the decision).

Training never reads queries or qrels. ``--split train`` scores SciFact's train queries (used to choose
defaults); ``--split test`` gives the reported figures.

    python benchmarks/adapt.py --minutes 60 --split test
    python benchmarks/adapt.py --minutes 30 --split test --variants both --msmarco
    python benchmarks/adapt.py --minutes 20 --variants both unguarded teacher --teacher DIR --modes dense --no-sts

Writes ``benchmarks/results/adapt_<split>.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402

DATA = Path(os.environ.get("CLOZE_DATA_DIR", ROOT.parent / "shared" / "data"))
RESULTS = ROOT / "benchmarks" / "results"
SCIFACT = DATA / "beir-scifact"
MSMARCO = DATA / "beir-msmarco-subset"
ABLATION = ("both", "mlm-only", "contrastive-only", "no-negatives")
VARIANTS = (*ABLATION, "no-distill", "unguarded", "teacher")


def cloze(*args: str, log: Path) -> dict:
    """Run one ``cloze`` command; its last stdout line is a JSON object."""
    started = time.perf_counter()
    print("$ cloze", " ".join(args), flush=True)
    with log.open("a") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", *args],
            stdout=subprocess.PIPE,
            stderr=handle,
            text=True,
            cwd=ROOT,
        )
    if done.returncode:
        raise SystemExit(f"cloze {' '.join(args)} failed ({done.returncode}); see {log}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["command_seconds"] = round(time.perf_counter() - started, 1)
    return result


def beir(model: str, data: Path, mode: str, split: str, backend: str, log: Path) -> float:
    args = ["eval", "beir", "--data", str(data), "--mode", mode, "--split", split, "--backend", backend]
    return round(cloze(*args, *(["--model", model] if model else []), log=log)["ndcg@10"], 4)


def sts(model: str, log: Path) -> float:
    return round(cloze("eval", "sts", *(["--model", model] if model else []), log=log)["spearman"], 4)


def adapt_record(out: Path) -> dict | None:
    record = out / "training.json"
    return json.loads(record.read_text()) if record.is_file() else None


def adapt(corpus: Path, out: Path, minutes: float, extra: list[str], log: Path) -> dict:
    """Train unless ``out`` already holds a finished run; returns its ``training.json``."""
    if not adapt_record(out):
        cloze(
            "adapt", "--corpus", str(corpus), "--out", str(out), "--max-time-minutes", str(minutes),
            "--keep-work", *extra, log=log,
        )  # fmt: skip
    record = adapt_record(out)
    assert record is not None
    return record


def seeded_work(source: Path, target: Path, keep: tuple[str, ...]) -> None:
    """Start ``target``'s work folder from ``source``'s finished stages ``keep`` (shared, not retrained)."""
    if target.is_dir() or (target / "state.json").is_file():
        return
    state = json.loads((source / "state.json").read_text())
    target.mkdir(parents=True)
    for stage in keep:
        if stage in ("mine", "teacher"):  # cached files: mined pairs, the starting encoder's embeddings
            name = "mined.jsonl" if stage == "mine" else "teacher.pt"
            if (source / name).is_file():
                shutil.copy2(source / name, target / name)
        else:
            shutil.copytree(source / stage, target / stage, ignore=shutil.ignore_patterns("checkpoints"))
    seeded = {
        "spent": {k: v for k, v in state["spent"].items() if k in keep},
        "done": [k for k in state["done"] if k in keep],
        "records": {k: v for k, v in state.get("records", {}).items() if k in keep},
    }
    (target / "state.json").write_text(json.dumps(seeded, indent=2))


def stage_times(record: dict) -> dict:
    return {k: round(v / 60, 2) for k, v in record["seconds_spent"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="the --max-time-minutes of every run")
    parser.add_argument("--split", default="test", choices=["test", "train"])
    parser.add_argument("--variants", nargs="+", default=list(ABLATION), choices=VARIANTS)
    parser.add_argument("--msmarco", action="store_true", help="also adapt on the MS MARCO subset")
    parser.add_argument("--msmarco-minutes", type=float, help="budget there (default: --minutes)")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 (onnx-int8) check")
    parser.add_argument("--teacher", help="a CrossEncoder folder for the teacher variant")
    parser.add_argument("--modes", nargs="+", default=["dense", "hybrid"], choices=["dense", "hybrid"])
    parser.add_argument("--no-sts", action="store_true", help="skip STS-B (time)")
    parser.add_argument(
        "--backend",
        default="torch",
        choices=["torch", "onnx-int8"],
        help="the scores' backend (int8: faster)",
    )
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "adapt-benchmark")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "commands.log"
    corpus = SCIFACT / "corpus.jsonl.gz"
    started = time.perf_counter()
    loads = [load_average()[0]]
    result: dict = {
        "command": command(),
        "minutes": args.minutes,
        "split": args.split,
        "backend": args.backend,
        "scifact": {},
    }

    def scores(model: str) -> dict:
        values = {mode: beir(model, SCIFACT, mode, args.split, args.backend, log) for mode in args.modes}
        loads.append(load_average()[0])
        return values if args.no_sts else values | {"sts_b_test": sts(model, log)}

    result["scifact"]["bundled"] = scores("")
    both = args.work / "scifact-both"
    both_work = both.with_name(both.name + ".work")
    variants = [v for v in VARIANTS if v in args.variants or v == "both"]
    for variant in variants:
        out = args.work / f"scifact-{variant}"
        work = out.with_name(out.name + ".work")
        if variant == "both":
            record = adapt(corpus, out, args.minutes, [], log)
        elif variant == "mlm-only":
            seeded_work(both_work, work, ("mlm",))
            mlm_minutes = args.minutes * adapt_record(both)["recipe"]["mlm_fraction"]
            record = adapt(corpus, out, mlm_minutes, ["--stages", "mlm"], log)
        elif variant == "contrastive-only":
            seeded_work(both_work, work, ("mine",))
            spent = adapt_record(both)["seconds_spent"]
            minutes = args.minutes - spent.get("mlm", 0.0) / 60  # the same contrastive time as "both"
            record = adapt(corpus, out, minutes, ["--stages", "contrastive"], log)
        elif variant == "no-distill":
            seeded_work(both_work, work, ("mine", "mlm"))
            record = adapt(corpus, out, args.minutes, ["--distill-weight", "0"], log)
        elif variant == "unguarded":
            seeded_work(both_work, work, ("mine", "teacher", "mlm", "contrastive"))
            record = adapt(corpus, out, args.minutes, ["--guard-pairs", "0"], log)
        elif variant == "teacher":
            if not args.teacher:
                raise SystemExit("the teacher variant needs --teacher DIR")
            seeded_work(both_work, work, ("mine", "teacher"))
            record = adapt(corpus, out, args.minutes, ["--teacher", args.teacher], log)
        else:
            seeded_work(both_work, work, ("mlm",))
            record = adapt(corpus, out, args.minutes, ["--mine-negatives", "false"], log)
        entry = {"stage_minutes": stage_times(record), "stages": record["stages"], **scores(str(out))}
        entry["guard"] = record.get("guard")
        result["scifact"][variant] = entry
        (args.work / "partial.json").write_text(json.dumps(result, indent=2))

    if not args.no_int8:
        int8 = {
            mode: beir(str(both), SCIFACT, mode, args.split, "onnx-int8", log) for mode in ("dense", "hybrid")
        }
        result["scifact"]["both"]["int8"] = int8  # against its own fp32 (torch) figures above
    if args.msmarco:
        out = args.work / "msmarco-both"
        record = adapt(MSMARCO / "corpus.jsonl.gz", out, args.msmarco_minutes or args.minutes, [], log)
        result["msmarco"] = {
            "bundled": {"dense": beir("", MSMARCO, "dense", "test", "torch", log)},
            "both": {
                "dense": beir(str(out), MSMARCO, "dense", "test", "torch", log),
                "sts_b_test": sts(str(out), log),
                "stage_minutes": stage_times(record),
                "stages": record["stages"],
            },
        }
    loads.append(load_average()[0])
    result["load_average_1min_samples"] = loads
    result["wall_time_s"] = round(time.perf_counter() - started, 1)
    out_file = args.out or RESULTS / f"adapt_{args.split}.json"
    out_file.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"written: {out_file}")


def print_table(result: dict) -> None:
    print(f"SciFact ({result['split']} queries), budget {result['minutes']} min")
    print(f"{'variant':18} {'dense':>7} {'hybrid':>7} {'STS-B':>7}  check  stage minutes")
    for name, entry in result["scifact"].items():
        minutes = " ".join(f"{k} {v}" for k, v in entry.get("stage_minutes", {}).items())
        values = " ".join(
            f"{entry[k]:7.4f}" if k in entry else f"{'-':>7}" for k in ("dense", "hybrid", "sts_b_test")
        )
        check = entry.get("guard") or {}
        kept = f"{check['decision']}@{check['alpha']}" if check.get("decision") else "-"
        print(f"{name:18} {values}  {kept:6} {minutes}")
    if "int8" in result["scifact"].get("both", {}):
        print("int8 (both):", result["scifact"]["both"]["int8"])
    if "msmarco" in result:
        print(
            "MS MARCO dense:", result["msmarco"]["bundled"]["dense"], "->", result["msmarco"]["both"]["dense"]
        )


if __name__ == "__main__":
    main()
