"""``cloze train tokenizer|pretrain`` and ``cloze eval mlm``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from encoder_training.pretraining.recipes import add_override_arguments, load_recipe


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    _add_tokenizer(groups["train"])
    _add_pretrain(groups["train"])
    _add_mlm(groups["eval"])


def _add_tokenizer(train: argparse._SubParsersAction) -> None:
    p = train.add_parser("tokenizer", help="train a WordPiece tokenizer with BERT special tokens")
    p.add_argument("--input", nargs="+", required=True, help="text files or folders (.txt, .raw, .gz)")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.set_defaults(handler=_tokenizer)


def _tokenizer(args: argparse.Namespace) -> None:
    from encoder_training.pretraining.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(args.input, args.vocab_size, args.out, lowercase=not args.cased)
    print(json.dumps({"out": str(args.out), "vocab_size": len(tokenizer)}))


def _add_pretrain(train: argparse._SubParsersAction) -> None:
    p = train.add_parser(
        "pretrain", help="MLM or ELECTRA pre-training from a recipe (every recipe field is an option)"
    )
    p.add_argument("--recipe", default="tiny-cpu", help="tiny-cpu | small | base | a YAML path")
    p.add_argument("--input", nargs="+", required=True, help="text files or folders")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tokenizer", help="tokenizer folder (default: train one on --input)")
    p.add_argument(
        "--resume", action="store_true", help="continue from the last checkpoint in OUT/checkpoints"
    )
    add_override_arguments(p)
    p.set_defaults(handler=_pretrain)


def _pretrain(args: argparse.Namespace) -> None:
    from encoder_training.pretraining.train import pretrain

    cfg = load_recipe(args.recipe, vars(args))
    metrics = pretrain(cfg, args.input, args.out, args.tokenizer, args.resume)
    if metrics:
        summary = {
            k: metrics[k]
            for k in ("objective", "steps", "tokens_per_s", "final_loss", "peak_rss_mb", "heldout")
        }
        print(json.dumps({"out": str(args.out), **summary}))


def _add_mlm(evaluate: argparse._SubParsersAction) -> None:
    p = evaluate.add_parser("mlm", help="held-out masked-token accuracy and pseudo-perplexity")
    p.add_argument("--model", required=True, type=Path, help="a BertForMaskedLM-loadable folder")
    p.add_argument("--data", nargs="+", required=True, help="held-out text files or folders")
    p.add_argument("--ppl-lines", type=int, default=200, help="sentences scored for pseudo-perplexity")
    p.set_defaults(handler=_mlm)


def _mlm(args: argparse.Namespace) -> None:
    from encoder_training.pretraining.heldout import evaluate_mlm

    print(json.dumps(evaluate_mlm(args.model, args.data, ppl_lines=args.ppl_lines)))
