"""``cloze train finetune``: SBERT siamese fine-tuning.

Named training sets are read from a data folder (``encoder_training.data_folder``); a user's own JSONL /
TSV pairs need no data folder at all.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from encoder_training.data_folder import default_data_dir
from encoder_training.finetuning.train import LOSSES


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    _add_finetune(groups["train"])


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
