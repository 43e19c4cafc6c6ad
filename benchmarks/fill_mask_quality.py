"""The default fill-mask model before and after a training run, side by side (issue 47).

For each model folder: the plausibility suite (``benchmarks/data/fill_mask_plausibility.json``: top-1 and
top-5 accepted, top-1 copied from the sentence), held-out masked-token accuracy on WikiText-2 *test* (never
trained on by the new recipe) under BERT token masking (15%, 80-10-10) and under the training run's masking
(whole words, content words, 40%), LAMA P@1 (T-REx, Google-RE, SQuAD, as ``cloze eval lama``) and the
latency of one ``fill_mask`` request through the service's runtime, the two models' requests interleaved so
background load hits both alike. The run's loss curve comes from its ``metrics.json``.

    python benchmarks/fill_mask_quality.py --before OLD_MLM_FOLDER --after runs/fm-all6 \
        [--lama-before benchmarks/results/pretrain_fill_mask.json] [--requests 200]

``--lama-before`` takes the old model's LAMA figures from an earlier result file (the same weights) instead of
scoring them again. Writes ``results/fill_mask_all_layers.json`` and ``results/fill_mask_all_layers_loss.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
SUITE = ROOT / "benchmarks" / "data" / "fill_mask_plausibility.json"
sys.path.insert(0, str(ROOT))

LATENCY_TEXTS = [
    "Paris is the capital of [MASK].",
    "He unlocked the door with his [MASK].",
    "The doctor prescribed a new [MASK] for her infection.",
    "We went to the [MASK] to buy bread and milk.",
]


def heldout_accuracy(model_dir: Path, blocks_limit: int = 256) -> dict:
    """Masked-token accuracy on WikiText-2 test blocks under two maskings, with fixed seeds."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from encoder_training.masking import MaskingConfig
    from encoder_training.pretraining.data import MaskingCollator, pack_blocks, read_documents
    from encoder_training.pretraining.heldout import heldout_metrics

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    documents = list(read_documents([DATA / "wikitext-2-raw" / "wiki.test.raw"]))
    blocks = pack_blocks(tokenizer, documents, 128)[:blocks_limit]
    maskings = {
        "bert_token_15": MaskingConfig(),
        "whole_word_content_40": MaskingConfig(strategy="whole_word", rate=0.4, words="content"),
    }
    size = model.config.vocab_size
    return {
        name: heldout_metrics(model, blocks, MaskingCollator.for_tokenizer(tokenizer, masking, size))
        for name, masking in maskings.items()
    }


def latency(models: dict[str, Path], requests: int) -> dict:
    """Median and p95 ms of one single-text ``fill_mask`` call per model, the models' calls interleaved."""
    from encoder_runtime import load_fill_mask

    runtimes = {name: load_fill_mask(path) for name, path in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(requests + 10):
        text = LATENCY_TEXTS[i % len(LATENCY_TEXTS)]
        for name, runtime in runtimes.items():
            started = time.perf_counter()
            runtime.fill_mask([text], top_k=5)
            if i >= 10:  # warm-up
                times[name].append((time.perf_counter() - started) * 1000)
    return {
        name: {
            "median_ms": round(statistics.median(t), 2),
            "p95_ms": round(sorted(t)[int(len(t) * 0.95) - 1], 2),
            "requests": len(t),
            "backend": runtimes[name].backend.name,
        }
        for name, t in times.items()
    }


def loss_curve(metrics_path: Path, png: Path) -> dict:
    """The run's logged (step, loss) pairs, its recipe and held-out figures, and a plot of the curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = json.loads(metrics_path.read_text())
    points = [[e["step"], e["loss"]] for e in metrics["log_history"] if "loss" in e]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(*zip(*points, strict=True))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (content-word MLM)")
    ax.set_title("fill-mask: all six layers from the previous default")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return {
        "steps": metrics["steps"],
        "train_seconds": metrics["train_seconds"],
        "tokens_per_s": metrics["tokens_per_s"],
        "config": metrics["config"],
        "heldout_corpus_sample": metrics["heldout"],
        "loss_curve": points,
    }


def lama(model_dir: Path) -> dict:
    from evaluation.lama import evaluate_lama

    result = evaluate_lama(model_dir, DATA / "lama")
    return {k: result[k] for k in ("p@1", "p@10", "facts", "coverage", "google_re", "squad")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--lama-before", type=Path, help="an earlier result file with the old model's `lama`")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS / "fill_mask_all_layers.json")
    args = parser.parse_args()

    from evaluation.plausibility import evaluate_plausibility

    models = {"before": args.before, "after": args.after}
    result: dict = {"command": "python benchmarks/fill_mask_quality.py " + " ".join(sys.argv[1:])}
    result["date"] = time.strftime("%Y-%m-%d")
    result["suite"] = {name: evaluate_plausibility(path, SUITE) for name, path in models.items()}
    result["wikitext2_test_heldout"] = {name: heldout_accuracy(path) for name, path in models.items()}
    result["lama"] = {
        "before": json.loads(args.lama_before.read_text())["lama"] if args.lama_before else lama(args.before),
        "after": lama(args.after),
    }
    for entry in result["lama"].values():
        entry.pop("per_relation", None)
        entry.pop("model", None)
    result["latency"] = latency(models, args.requests)
    metrics = args.after / "metrics.json"
    if metrics.is_file():
        result["training"] = loss_curve(metrics, args.out.with_name(args.out.stem + "_loss.png"))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "training"}, indent=1)[:4000])


if __name__ == "__main__":
    main()
