"""Training on a GPU in one device call, each model under its own budget; the weights come back in parts.

1. fill-mask: the recipe in encoder_runtime/models/fill-mask-delta/README.md resumed from the shipped weights
   (every layer and the head free, the embeddings frozen) on the corpus as it is, for as many steps as
   ``--fill-mask-minutes`` allows, held-out loss logged every ``--eval-steps``; then its fp16 delta.
2. reranker: ``cloze train reranker`` on SciFact train. The settings (loss, learning rate, starting weights:
   the bundled encoder or the shipped fill-mask model's encoder) are chosen by a short run each, scored on
   the train split's held-out dev queries; the best is then trained for ``--rerank-minutes``, at most
   ``--rerank-epochs`` epochs. Its weights are rounded to fp16 to travel.

Everything goes into one tar split into parts under 16 MiB with checksums (benchmarks/gpu_run/parts.py) in
``--out``, beside ``train.json`` (every command, budget, loss history and dev score). Here,
``benchmarks/gpu_run/bring_back.py`` joins and judges them. ``--dry-run`` runs every step on the CPU with a
tiny model and seconds-long budgets (the steps in order: docs/benchmarks.md, "Running the benchmarks on a
GPU").
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_run.parts import split  # noqa: E402

# The fill-mask recipe (encoder_runtime/models/fill-mask-delta/README.md) less its CPU-bound sizes.
FILL_MASK_RECIPE = [
    "--recipe", "tiny-cpu", "--objective", "mlm", "--train-top-layers", "6", "--block-size", "128",
    "--masking", "whole_word", "--mask-words", "content", "--mask-rate", "0.4", "--dropout", "0",
    "--warmup-steps", "100", "--max-steps", "100000", "--seed", "11",
]  # fmt: skip
# Settings tried on the dev queries: (loss, learning rate, batch size, start); "" starts from the bundled encoder.
RERANK_GRID = [
    ("bce", 3e-5, 16, ""),
    ("bce", 1e-4, 16, ""),
    ("mnrl", 3e-5, 32, ""),
    ("bce", 3e-5, 16, "fill-mask"),
]


def run(argv: list[str], log: Path) -> None:
    """``cloze ...`` as a user runs it, its output appended to ``log``."""
    with log.open("a") as handle:
        handle.write(f"$ cloze {' '.join(argv)}\n")
        handle.flush()
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", *argv], cwd=ROOT, stdout=handle, stderr=handle
        )
    if done.returncode:
        raise RuntimeError(f"cloze {argv[0]} {argv[1]} failed ({done.returncode}); see {log}")


def fill_mask(args, start: Path, work: Path, log: Path) -> dict:
    from encoder_runtime.model_dir import bundled_model_path
    from encoder_training.pretraining.delta import extract_delta

    model = work / "fill-mask"
    # later options win: the dry run's few steps replace the recipe's
    flags = ["--batch-size", "4", "--max-steps", "4", "--eval-steps", "2"] if args.dry_run else [
        "--batch-size", "64", "--eval-steps", str(args.eval_steps), "--precision", "auto",
    ]  # fmt: skip
    run(
        ["train", "pretrain", *FILL_MASK_RECIPE, *flags, "--init-from", str(start), "--input", *args.text,
         "--out", str(model), "--learning-rate", str(args.fill_mask_lr), "--save-steps", "100000",
         "--max-time-minutes", str(args.fill_mask_minutes)],
        log,
    )  # fmt: skip
    metrics = json.loads((model / "metrics.json").read_text())
    delta = args.out_dir / "fill-mask-delta"
    extract_delta(model, bundled_model_path(), delta, 6, {"recipe": metrics["config"]})
    origin = bundled_model_path() / "travelled_from.json"
    if origin.is_file():  # trained over the fp16 copy that travelled: its base is the package it came from
        manifest = json.loads((delta / "manifest.json").read_text())
        manifest["base_fingerprint"] = json.loads(origin.read_text())["fingerprint"]
        manifest["base_note"] = (
            "trained over the bundled weights rounded to fp16 (benchmarks/gpu.py --prepare)"
        )
        (delta / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    history = metrics["log_history"]
    summary = {key: metrics[key] for key in ("steps", "train_seconds", "tokens_per_s", "heldout")}
    summary["heldout_every"] = [
        {key: entry[key] for key in ("step", "heldout_loss", "heldout_accuracy")}
        for entry in history
        if "heldout_loss" in entry
    ]
    summary["train_loss"] = [[entry["step"], entry["loss"]] for entry in history if "loss" in entry]
    return summary


def reranker(args, fill_mask_start: Path, work: Path, log: Path) -> dict:
    common = ["train", "reranker", "--beir", str(args.scifact), "--split", "train", "--backend", "torch",
              "--dev-queries", str(args.dev_queries), "--dev-candidates", "30", "--force"]  # fmt: skip
    if args.dry_run:
        common += ["--max-length", "64", "--dev-candidates", "5"]
    tried, index = [], None
    for number, (loss, lr, batch, start) in enumerate(RERANK_GRID):
        out = work / f"rerank-try-{number}"
        model = str(fill_mask_start) if start == "fill-mask" else args.tiny_model or ""
        argv = [*common, "--out", str(out), "--loss", loss, "--learning-rate", str(lr), "--batch-size", str(batch),
                "--max-time-minutes", str(args.grid_minutes), *(["--model", model] if model else []),
                *(["--index", str(index)] if index else [])]  # fmt: skip
        if args.tiny_model:
            argv += ["--encoder", args.tiny_model]
        run(argv, log)
        index = index or out.with_name(out.name + ".work") / "index"  # the first run's index serves the rest
        record = json.loads((out / "training.json").read_text())
        tried.append({"loss": loss, "learning_rate": lr, "batch_size": batch, "start": start or args.tiny_model or "bundled",
                      "argv": argv, "rows": record["rows"], "training": record["training"], "dev": record["dev"]})  # fmt: skip
    best = max(tried, key=lambda t: t["dev"].get("reranked_ndcg@10", -1.0))  # the first of equals
    final = args.out_dir / "reranker"
    argv = list(best["argv"])
    argv[argv.index("--out") + 1] = str(work / "reranker")
    argv[argv.index("--max-time-minutes") + 1] = str(args.rerank_minutes)
    steps = max(1, int(args.rerank_epochs * best["rows"] / best["batch_size"]))  # several epochs, not more
    run([*argv, "--max-steps", str(steps)], log)
    record = json.loads((work / "reranker" / "training.json").read_text())
    to_fp16(work / "reranker", final)
    return {"grid": tried, "chosen": {k: best[k] for k in ("loss", "learning_rate", "batch_size", "start")},
            "final": {"training": record["training"], "dev": record["dev"]}}  # fmt: skip


def to_fp16(source: Path, target: Path) -> None:
    """A CrossEncoder folder with its weights rounded to fp16 (loaders upcast them: ``dtype`` float32)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target, dirs_exist_ok=True)
    weights = load_file(source / "model.safetensors")
    save_file(
        {k: v.half().contiguous() if v.is_floating_point() else v for k, v in weights.items()},
        target / "model.safetensors",
        metadata={"format": "pt"},
    )
    config = json.loads((target / "config.json").read_text())
    config["dtype"] = "float32"
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def guarded(result: dict, name: str, fn) -> None:
    started = time.monotonic()
    try:
        result[name] = fn()
    except Exception as exc:  # the other model still trains; the error is in train.json
        result[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    result[name]["seconds"] = round(time.monotonic() - started, 1)
    print(f"[{name}] {json.dumps(result[name])[:400]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--text", nargs="+", required=True, help="the fill-mask corpus (files or folders)")
    parser.add_argument("--scifact", type=Path, required=True, help="BEIR SciFact (train qrels used)")
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", "runs/gpu-train")))
    parser.add_argument("--fill-mask-minutes", type=float, default=3.0)
    parser.add_argument("--fill-mask-lr", type=float, default=1e-4)
    parser.add_argument("--eval-steps", type=int, default=300)
    parser.add_argument(
        "--grid-minutes", type=float, default=0.4, help="each setting's run on the dev queries"
    )
    parser.add_argument("--rerank-minutes", type=float, default=1.5)
    parser.add_argument("--rerank-epochs", type=float, default=4.0)
    parser.add_argument("--dev-queries", type=int, default=100)
    parser.add_argument("--tiny-model", help="start the rerankers (and mine) from this folder: the dry run's")
    parser.add_argument("--dry-run", action="store_true", help="every step, tiny and quick, on the CPU")
    args = parser.parse_args()
    from encoder_runtime.default_fill_mask import default_fill_mask_path

    work = Path(os.environ.get("TMPDIR", "/tmp")) / "cloze-gpu-train"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log = args.out_dir / "commands.log"
    start = default_fill_mask_path()
    result: dict = {
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    guarded(result, "fill_mask", lambda: fill_mask(args, start, work, log))
    guarded(result, "reranker", lambda: reranker(args, start, work, log))
    models = [p for p in (args.out_dir / "fill-mask-delta", args.out_dir / "reranker") if p.is_dir()]
    if models:
        result["parts"] = [p.name for p in split(models, "trained", 15.0, args.out_dir)]
        for path in models:
            shutil.rmtree(path)  # only the parts come back
    (args.out_dir / "train.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out_dir / 'train.json'}")


if __name__ == "__main__":
    main()
