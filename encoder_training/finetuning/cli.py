"""``cloze train finetune`` (SBERT siamese fine-tuning) and ``cloze eval sts`` (Spearman on STS sets).

Named training sets and the STS sets are read from a data folder (``--data-dir``, else
``CLOZE_DATA_DIR``, else ``../shared/data`` beside the checkout); a user's own JSONL / TSV pairs
need no data folder at all.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from encoder_training.finetuning.train import LOSSES


def default_data_dir() -> Path:
    env = os.environ.get("CLOZE_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    _add_finetune(groups["train"])
    _add_eval_sts(groups["eval"])


def _add_finetune(train: argparse._SubParsersAction) -> None:
    p = train.add_parser("finetune", help="SBERT siamese fine-tuning of any encoder folder")
    p.add_argument("--model", required=True, help="encoder folder (MLM / ELECTRA output, HF or ST model)")
    p.add_argument("--out", required=True, help="output sentence-transformers folder")
    p.add_argument("--loss", choices=LOSSES, default="mnrl")
    p.add_argument(
        "--pairs",
        nargs="+",
        default=[],
        help="named sets (snli, snli-triplets, snli-labelled, "
        "coco, msrp, stsb-train) or JSONL/TSV files; default depends on --loss",
    )
    p.add_argument("--columns", help="comma-separated columns to read from pairs files, in loss order")
    p.add_argument("--limit", type=int, help="at most this many rows per pairs source")
    p.add_argument("--matryoshka-dims", nargs="+", type=int, default=[], help="e.g. 384 256 128 64")
    p.add_argument("--pooling", choices=["mean", "cls", "max"], default="mean")
    p.add_argument("--no-normalize", action="store_true", help="don't append an L2-normalisation module")
    p.add_argument("--max-seq-length", type=int)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--mini-batch-size", type=int, default=16, help="cached-mnrl forward chunk")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs when > 0")
    p.add_argument(
        "--eval-steps", type=int, default=0, help="STS-B dev evaluation every N steps (0: at the end)"
    )
    p.add_argument(
        "--eval-pairs", type=int, default=500, help="STS-B dev pairs for evaluation during training"
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", type=Path, default=None)
    p.set_defaults(handler=_finetune)


def _finetune(args: argparse.Namespace) -> None:
    from encoder_training.finetuning.train import TRAINING_RECORD, FinetuneConfig, finetune

    config = FinetuneConfig(
        model=args.model,
        out=args.out,
        loss=args.loss,
        pairs=args.pairs,
        columns=args.columns.split(",") if args.columns else None,
        limit=args.limit,
        matryoshka_dims=args.matryoshka_dims,
        pooling=args.pooling,
        normalize=not args.no_normalize,
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        mini_batch_size=args.mini_batch_size,
        learning_rate=args.lr,
        epochs=args.epochs,
        max_steps=args.max_steps,
        eval_steps=args.eval_steps,
        eval_pairs=args.eval_pairs,
        seed=args.seed,
        data_dir=str(args.data_dir or default_data_dir()),
    )
    out = finetune(config)
    record = json.loads((out / TRAINING_RECORD).read_text())
    summary = {k: record[k] for k in ("steps", "wall_time_s", "data", "sts_dev")}
    print(json.dumps({"out": str(out), **summary}))


def _add_eval_sts(evaluate: argparse._SubParsersAction) -> None:
    p = evaluate.add_parser("sts", help="Spearman of cosine similarity on STS-B test (and SICK-R, STS12-16)")
    p.add_argument("--model", default="", help="model folder (default: bundled model)")
    p.add_argument(
        "--sets", nargs="+", default=["stsb-test"], help="stsb-test stsb-dev sick-r sts12 .. sts16, or all"
    )
    p.add_argument("--backend", default="torch", choices=["torch", "onnx", "onnx-int8", "auto"])
    p.add_argument("--limit", type=int, help="at most this many pairs per set")
    p.add_argument("--data-dir", type=Path, default=None)
    p.set_defaults(handler=_eval_sts)


def _eval_sts(args: argparse.Namespace) -> None:
    from encoder_training.evaluation.sts import evaluate_sts

    result = evaluate_sts(
        args.model or None, args.data_dir or default_data_dir(), args.sets, args.backend, args.limit
    )
    for name, scores in result["sets"].items():
        print(f"{name:10s} spearman {scores['spearman']:.4f}  pairs {scores['pairs']}")
    print(json.dumps(result))
