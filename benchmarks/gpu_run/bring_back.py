"""Here, after benchmarks/gpu_run/train.sh ran on a GPU: join its parts, judge each model against what ships,
side by side, on data it neither trained nor chose settings on, and ship only a winner.

1. ``parts.py join`` (every part's checksum checked) into ``--work``;
2. fill-mask: the new delta assembled over the bundled encoder and ``benchmarks/fill_mask_quality.py`` with
   the shipped model as ``--before`` (plausibility suite, WikiText-2 *test*, LAMA, latency). It wins when its
   top-1 acceptance, T-REx P@1 and WikiText-2 test accuracy are all at least the shipped model's and one is
   higher; ``--ship`` then replaces encoder_runtime/models/fill-mask-delta;
3. reranker: ``benchmarks/rerank.py`` on SciFact *test* and the MS MARCO subset (50 candidates, hybrid), fp32,
   then its int8 ONNX export (``cloze export``) on the same rows. It wins when reranking beats the first
   stage on both and int8 is within 0.01 of fp32. Shipping it as the default ``CLOZE_RERANK_MODELS`` entry
   needs a bundled-reranker loader (as the fill-mask delta has) that does not exist yet: a winner is
   reported with the line that serves it.

Writes ``--out`` (benchmarks/results/gpu_training.json): every command, both models' figures, the verdicts;
beside it each benchmark's own file (``gpu_fill_mask_quality.json``, ``gpu_rerank.json``).

    python benchmarks/gpu_run/bring_back.py RUN_OUT_DIR [--ship]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_run.parts import join  # noqa: E402

SHIPPED_DELTA = ROOT / "encoder_runtime" / "models" / "fill-mask-delta"
RESULTS = ROOT / "benchmarks" / "results"
INT8_TOLERANCE = 0.01


def python(script: str, *argv: str) -> None:
    print(f"$ python {script} {' '.join(argv)}", flush=True)
    subprocess.run([sys.executable, script, *argv], cwd=ROOT, check=True)


def fill_mask_figures(result: dict, side: str) -> tuple[float, float, float]:
    """(top-1 accepted, T-REx P@1, WikiText-2 test accuracy) of one side of fill_mask_quality's result."""
    return (
        result["suite"][side]["top1_accepted"],
        result["lama"][side]["p@1"],  # T-REx; Google-RE and SQuAD are nested beside it
        result["wikitext2_test_heldout"][side]["bert_token_15"]["accuracy"],
    )


def fill_mask_wins(before: tuple[float, ...], after: tuple[float, ...]) -> bool:
    return all(a >= b for a, b in zip(after, before, strict=True)) and after != before


def judge_fill_mask(delta: Path, work: Path, out: Path) -> dict:
    from encoder_runtime.default_fill_mask import assemble, default_fill_mask_path

    candidate = work / "fill-mask-candidate"
    shutil.rmtree(candidate, ignore_errors=True)
    assemble(candidate, delta)
    python("benchmarks/fill_mask_quality.py", "--before", str(default_fill_mask_path()), "--after",
           str(candidate), "--out", str(out))  # fmt: skip
    result = json.loads(out.read_text())
    before, after = fill_mask_figures(result, "before"), fill_mask_figures(result, "after")
    names = ("top1_accepted", "trex_p@1", "wikitext2_test_accuracy")
    return {
        "before": dict(zip(names, before, strict=True)),
        "after": dict(zip(names, after, strict=True)),
        "wins": fill_mask_wins(before, after),
    }


def reranker_rows(result: dict, label: str) -> dict[str, dict]:
    """SciFact test and MS MARCO, hybrid, 50 candidates, one backend: first stage and reranked nDCG@10."""
    return {
        row["dataset"]: {"first_stage": row["first_stage"]["ndcg@10"], "reranked": row["reranked"]["ndcg@10"]}
        for row in result.get("rows", [])
        if row["backend"] == label and row["mode"] == "hybrid" and row["candidates"] == 50
    }


def reranker_wins(fp32: dict[str, dict], int8: dict[str, dict]) -> bool:
    """Reranking beats the first stage on every dataset, and int8 is within ``INT8_TOLERANCE`` of fp32."""
    if not fp32 or set(int8) != set(fp32):
        return False
    helps = all(row["reranked"] > row["first_stage"] for row in fp32.values())
    close = all(abs(int8[name]["reranked"] - row["reranked"]) <= INT8_TOLERANCE for name, row in fp32.items())
    return helps and close


def judge_reranker(model: Path, work: Path, out: Path) -> dict:
    rows = ["scifact:hybrid:50", "msmarco:hybrid:50"]
    common = [
        "--model",
        str(model),
        "--work",
        str(work / "rerank-scores"),
        "--out",
        str(out),
        "--rows",
        *rows,
    ]
    python("benchmarks/rerank.py", *common)
    print(f"$ cloze export onnx --model {model} --task rerank", flush=True)
    subprocess.run([sys.executable, "-m", "app.cli", "export", "onnx", "--model", str(model), "--task", "rerank"],
                   cwd=ROOT, check=True)  # fmt: skip
    python("benchmarks/rerank.py", *common, "--onnx", str(model / "onnx" / "rerank_int8.onnx"),
           "--backend-label", "onnx-int8")  # fmt: skip
    result = json.loads(out.read_text())
    fp32, int8 = reranker_rows(result, "torch"), reranker_rows(result, "onnx-int8")
    return {"fp32": fp32, "int8": int8, "wins": reranker_wins(fp32, int8)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("parts", type=Path, help="the folder the device call's files were fetched into")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "gpu-trained")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_training.json")
    parser.add_argument("--ship", action="store_true", help="replace what ships where the new model wins")
    args = parser.parse_args()
    join([args.parts], "trained", args.work)
    result: dict = {"command": "python benchmarks/gpu_run/bring_back.py " + " ".join(sys.argv[1:])}
    if (args.parts / "train.json").is_file():
        result["training"] = json.loads((args.parts / "train.json").read_text())
    delta = args.work / "fill-mask-delta"
    if delta.is_dir():
        result["fill_mask"] = judge_fill_mask(
            delta, args.work, args.out.with_name("gpu_fill_mask_quality.json")
        )
        if result["fill_mask"]["wins"] and args.ship:
            shutil.copytree(delta, SHIPPED_DELTA, dirs_exist_ok=True)
            result["fill_mask"]["shipped"] = str(SHIPPED_DELTA.relative_to(ROOT))
    reranker = args.work / "reranker"
    if reranker.is_dir():
        result["reranker"] = judge_reranker(reranker, args.work, args.out.with_name("gpu_rerank.json"))
        if result["reranker"]["wins"]:
            result["reranker"]["serve_with"] = f"CLOZE_RERANK_MODELS=default={reranker}"
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "training"}, indent=1)[:3000])


if __name__ == "__main__":
    main()
