"""ELECTRA vs MLM at equal wall-clock pre-training, fine-tuned identically, with a random-init floor;
plus the regression check of the fine-tuning path on the bundled all-MiniLM-L6-v2.

Every step is a real ``cloze`` command in its own process (tokenizer, pretrain, finetune, eval), so
this measures the product's commands, not a copy of them. Finished steps are reused on a rerun
(``--work``), so a long run can be resumed.

    python benchmarks/electra_vs_mlm.py --pretrain-minutes 20 --finetune-steps 2000 --sts-epochs 10 --sts-lr 5e-4
    python benchmarks/electra_vs_mlm.py --only minilm        # just the regression check

Writes ``benchmarks/results/electra_vs_mlm.json`` (+ ``.png``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("CLOZE_DATA_DIR", ROOT.parent / "shared" / "data"))
RESULTS = ROOT / "benchmarks" / "results"
TEXT = [DATA / "english-prose-public-domain", DATA / "wikitext-2-raw" / "wiki.valid.raw"]
PAIRS = ["snli-triplets", "coco", "msrp"]
MINILM_REFERENCE = 0.820
# Smaller than the tiny-cpu recipe: a short budget on two shared cores buys a few hundred steps of this
# size, and too few of a larger one; a short warm-up so the learning rate peaks inside the budget.
SMALL_MODEL = [
    "--hidden-size",
    "128",
    "--num-layers",
    "2",
    "--num-heads",
    "2",
    "--intermediate-size",
    "512",
    "--block-size",
    "128",
    "--batch-size",
    "16",
    "--warmup-steps",
    "20",
]
# Peak learning rate per objective (it decays to zero at the end of the budget). ELECTRA's discriminator at
# this size stays at the prior (replaced-token AUC 0.52-0.54 after 1.5 minutes) at 1e-3 and 5e-4, and
# learns at 2e-4 (AUC 0.80); MLM trains at 1e-3.
PRETRAIN_LR = {"mlm": "1e-3", "electra": "2e-4"}


def cloze(*args: str, log: Path) -> dict:
    """Run one ``cloze`` command; its last stdout line is a JSON object."""
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "app.cli", *args]
    print("$ cloze", " ".join(args), flush=True)
    with log.open("a") as handle:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=handle, text=True, cwd=ROOT)
    handle_lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not handle_lines:
        raise SystemExit(f"cloze {' '.join(args)} failed ({done.returncode}); see {log}")
    result = json.loads(handle_lines[-1])
    result["_seconds"] = round(time.perf_counter() - started, 1)
    return result


class NotRun(Exception):
    """A step without a result while only collecting (``--collect``)."""


COLLECT_ONLY = False


def cached(path: Path, make) -> dict:
    """Reuse a step's result file when the step already ran (resumable runs)."""
    if path.is_file():
        return json.loads(path.read_text())
    if COLLECT_ONLY:
        raise NotRun(path.name)
    result = make()
    path.write_text(json.dumps(result, indent=2))
    return result


def pretrain(work: Path, objective: str, minutes: float, log: Path) -> dict:
    out = work / objective
    return cached(
        work / f"{objective}.pretrain.json",
        lambda: cloze(
            "train",
            "pretrain",
            "--recipe",
            "tiny-cpu",
            "--objective",
            objective,
            "--input",
            *map(str, TEXT),
            "--tokenizer",
            str(work / "tokenizer"),
            "--out",
            str(out),
            "--max-time-minutes",
            str(minutes),
            "--max-steps",
            "1000000",
            *SMALL_MODEL,
            "--learning-rate",
            PRETRAIN_LR[objective],
            log=log,
        ),
    )


def random_encoder(work: Path) -> Path:
    """Same architecture and tokenizer as the MLM run, random weights: what pre-training adds over nothing."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    out = work / "random"
    if not (out / "config.json").is_file():
        config = AutoConfig.from_pretrained(work / "mlm")
        AutoModel.from_config(config).save_pretrained(out)
        AutoTokenizer.from_pretrained(work / "mlm").save_pretrained(out)
    return out


def finetune_and_measure(work: Path, name: str, model: Path, args: argparse.Namespace, log: Path) -> dict:
    """Stage 1: MNRL on NLI/caption/paraphrase pairs; stage 2: cosine loss on STS-B train (SBERT's NLI+STSb)."""
    nli, sts = work / f"{name}-ft-nli", work / f"{name}-ft"
    stage1 = cached(
        work / f"{name}.ft1.json",
        lambda: cloze(
            "train",
            "finetune",
            "--model",
            str(model),
            "--out",
            str(nli),
            "--loss",
            "mnrl",
            "--pairs",
            *PAIRS,
            "--max-steps",
            str(args.finetune_steps),
            "--batch-size",
            "64",
            "--lr",
            str(args.lr),
            "--max-seq-length",
            "128",
            log=log,
        ),
    )
    stage2 = cached(
        work / f"{name}.ft2.json",
        lambda: cloze(
            "train",
            "finetune",
            "--model",
            str(nli),
            "--out",
            str(sts),
            "--loss",
            "cosine",
            "--pairs",
            "stsb-train",
            "--epochs",
            str(args.sts_epochs),
            "--batch-size",
            "32",
            "--lr",
            str(args.sts_lr),
            log=log,
        ),
    )
    scores = measure(work, name, sts, log)
    nli_sts = cached(
        work / f"{name}.sts-nli.json", lambda: cloze("eval", "sts", "--model", str(nli), log=log)
    )
    return {
        "finetune_seconds": stage1["wall_time_s"] + stage2["wall_time_s"],
        "finetune_steps": stage1["steps"] + stage2["steps"],
        "stsb_test_spearman_nli_only": round(nli_sts["spearman"], 4),
        **scores,
    }


def measure(work: Path, name: str, model: Path, log: Path) -> dict:
    sts = cached(
        work / f"{name}.sts.json",
        lambda: cloze("eval", "sts", "--model", str(model), "--sets", "stsb-test", "sick-r", log=log),
    )
    beir = cached(
        work / f"{name}.beir.json",
        lambda: cloze(
            "eval",
            "beir",
            "--data",
            str(DATA / "beir-scifact"),
            "--model",
            str(model),
            "--backend",
            "torch",
            "--index",
            str(work / f"{name}-scifact-index"),
            log=log,
        ),
    )
    return {
        "stsb_test_spearman": round(sts["spearman"], 4),
        "sick_r_spearman": round(sts["sets"]["sick-r"]["spearman"], 4),
        "scifact_ndcg@10": round(beir["ndcg@10"], 4),
    }


def electra_vs_mlm(work: Path, args: argparse.Namespace, log: Path) -> dict:
    if not (work / "tokenizer").is_dir():
        cloze(
            "train",
            "tokenizer",
            "--input",
            *map(str, TEXT),
            "--vocab-size",
            "8192",
            "--out",
            str(work / "tokenizer"),
            log=log,
        )
    rows = {}
    for objective in ("mlm", "electra"):
        try:
            pre = pretrain(work, objective, args.pretrain_minutes, log)
            rows[objective] = {
                "pretrain_minutes": args.pretrain_minutes,
                "pretrain_steps": pre.get("steps"),
                "pretrain_tokens_per_s": pre.get("tokens_per_s"),
                "heldout": pre.get("heldout"),
                **finetune_and_measure(work, objective, work / objective, args, log),
            }
        except NotRun as missing:
            rows[objective] = {"not_run": f"no result for step {missing}"}
    try:
        rows["random-init"] = {
            "pretrain_minutes": 0,
            **finetune_and_measure(work, "random", random_encoder(work), args, log),
        }
    except NotRun as missing:
        rows["random-init"] = {"not_run": f"no result for step {missing}"}
    return rows


def minilm_regression(work: Path, args: argparse.Namespace, log: Path) -> dict:
    """Further MNRL fine-tuning of the bundled model must not cost more than 0.01 STS-B test Spearman."""
    from encoder_runtime.model_dir import bundled_model_path

    before = cached(work / "minilm.sts-before.json", lambda: cloze("eval", "sts", log=log))
    out = work / "minilm-ft"
    train = cached(
        work / "minilm.ft.json",
        lambda: cloze(
            "train",
            "finetune",
            "--model",
            str(bundled_model_path()),
            "--out",
            str(out),
            "--pairs",
            *PAIRS,
            "--max-steps",
            str(args.minilm_steps),
            "--batch-size",
            "64",
            "--lr",
            "1e-5",
            log=log,
        ),
    )
    after = cached(work / "minilm.sts-after.json", lambda: cloze("eval", "sts", "--model", str(out), log=log))
    drop = before["spearman"] - after["spearman"]
    return {
        "reference": MINILM_REFERENCE,
        "before": round(before["spearman"], 4),
        "after": round(after["spearman"], 4),
        "drop": round(drop, 4),
        "steps": train["steps"],
        "finetune_seconds": train["wall_time_s"],
        "recipe": "mnrl, batch 64, lr 1e-5, pairs " + " ".join(PAIRS),
        "passed": drop <= 0.01,
    }


def plot(rows: dict, path: Path) -> None:
    rows = {name: row for name, row in rows.items() if "not_run" not in row}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for axis, key, title in zip(
        axes,
        ("stsb_test_spearman", "scifact_ndcg@10"),
        ("STS-B test Spearman", "SciFact nDCG@10"),
        strict=True,
    ):
        values = [rows[name][key] for name in names]
        axis.bar(names, values, color=["tab:blue", "tab:orange", "tab:gray"][: len(names)])
        for x, value in enumerate(values):
            axis.text(x, value, f"{value:.3f}", ha="center", va="bottom")
        axis.set_title(title)
        axis.set_ylim(0, max(1e-3, max(values)) * 1.2)
    fig.suptitle("equal wall-clock pre-training, identical fine-tuning")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_table(result: dict) -> None:
    rows = {name: row for name, row in result.get("electra_vs_mlm", {}).items() if "not_run" not in row}
    if rows:
        print(
            f"\n{'encoder':12} {'pretrain':>9} {'steps':>7} {'STS-B':>7} {'(NLI only)':>10} {'SICK-R':>7} {'SciFact':>8}"
        )
        for name, row in rows.items():
            print(
                f"{name:12} {row['pretrain_minutes']:>7}m {row.get('pretrain_steps') or 0:>7} "
                f"{row['stsb_test_spearman']:7.4f} {row['stsb_test_spearman_nli_only']:10.4f} "
                f"{row['sick_r_spearman']:7.4f} {row['scifact_ndcg@10']:8.4f}"
            )
    if "minilm_regression" in result:
        reg = result["minilm_regression"]
        print(
            f"\nall-MiniLM-L6-v2 STS-B test: before {reg['before']:.4f} after {reg['after']:.4f} "
            f"(drop {reg['drop']:+.4f}, {reg['steps']} steps) -> {'ok' if reg['passed'] else 'REGRESSION'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pretrain-minutes", type=float, default=30.0, help="wall-clock budget per objective"
    )
    parser.add_argument("--finetune-steps", type=int, default=2000, help="MNRL steps (stage 1) per encoder")
    parser.add_argument(
        "--sts-epochs", type=int, default=10, help="cosine-loss epochs on STS-B train (stage 2)"
    )
    parser.add_argument("--lr", type=float, default=2e-4, help="stage 1 learning rate of the small encoders")
    parser.add_argument("--sts-lr", type=float, default=5e-4, help="stage 2 learning rate")
    parser.add_argument("--minilm-steps", type=int, default=100)
    parser.add_argument("--only", choices=["electra", "minilm"], help="run one part")
    parser.add_argument("--collect", action="store_true", help="only report steps that already ran")
    parser.add_argument("--work", type=Path, default=Path("/tmp/cloze-electra-vs-mlm"))
    args = parser.parse_args()
    global COLLECT_ONLY
    COLLECT_ONLY = args.collect
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "commands.log"
    result_path = RESULTS / "electra_vs_mlm.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    result["machine"] = f"{os.cpu_count()} CPU cores"
    if args.only != "electra":
        result["minilm_regression"] = minilm_regression(args.work, args, log)
    if args.only != "minilm":
        result["settings"] = {
            **{k: v for k, v in vars(args).items() if k not in ("work", "only")},
            "pretrain_overrides": " ".join(SMALL_MODEL),
            "pretrain_learning_rate": PRETRAIN_LR,
            "finetune": "stage 1 mnrl on "
            + " ".join(PAIRS)
            + f", batch 64; stage 2 cosine on stsb-train, {args.sts_epochs} epochs, batch 32",
        }
        result["electra_vs_mlm"] = electra_vs_mlm(args.work, args, log)
        plot(result["electra_vs_mlm"], RESULTS / "electra_vs_mlm.png")
    RESULTS.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=2))
    print_table(result)


if __name__ == "__main__":
    main()
