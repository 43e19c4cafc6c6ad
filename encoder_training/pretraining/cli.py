"""``cloze train tokenizer|pretrain`` and ``cloze eval mlm|lama``.

Each eval command prints one JSON object as its last stdout line, for scripts to parse.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    _add_tokenizer(groups["train"])
    _add_pretrain(groups["train"])
    _add_eval_mlm(groups["eval"])
    _add_eval_lama(groups["eval"])


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
    from encoder_training.pretraining.recipes import add_override_arguments

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
    from encoder_training.pretraining.recipes import load_recipe
    from encoder_training.pretraining.train import pretrain

    cfg = load_recipe(args.recipe, vars(args))
    metrics = pretrain(cfg, args.input, args.out, args.tokenizer, args.resume)
    if metrics:
        summary = {
            k: metrics[k]
            for k in ("objective", "steps", "tokens_per_s", "final_loss", "peak_rss_mb", "heldout")
        }
        print(json.dumps({"out": str(args.out), **summary}))


def _add_eval_mlm(evaluate: argparse._SubParsersAction) -> None:
    p = evaluate.add_parser("mlm", help="held-out masked-token accuracy and pseudo-perplexity")
    p.add_argument("--model", required=True, type=Path, help="a BertForMaskedLM-loadable folder")
    p.add_argument("--data", nargs="+", required=True, help="held-out text files or folders")
    p.add_argument("--ppl-lines", type=int, default=200, help="sentences scored for pseudo-perplexity")
    p.set_defaults(handler=_eval_mlm)


def _eval_mlm(args: argparse.Namespace) -> None:
    from encoder_training.evaluation.mlm import evaluate_mlm

    print(json.dumps(evaluate_mlm(args.model, args.data, ppl_lines=args.ppl_lines)))


def default_lama_dir() -> Path:
    env = os.environ.get("CLOZE_DATA_DIR")
    base = Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"
    return base / "lama"


def _add_eval_lama(evaluate: argparse._SubParsersAction) -> None:
    p = evaluate.add_parser("lama", help="LAMA precision@1/@10 (T-REx, Google-RE, SQuAD)")
    p.add_argument("--model", default="", help="MLM folder (default: the service's default fill-mask model)")
    p.add_argument("--data", type=Path, default=None, help="LAMA folder (default: ../shared/data/lama)")
    p.add_argument("--limit", type=int, default=0, help="at most this many facts per relation (0 = all)")
    p.set_defaults(handler=_eval_lama)


def _eval_lama(args: argparse.Namespace) -> None:
    from encoder_training.evaluation.lama import evaluate_lama

    if args.model:
        model = Path(args.model)
    else:
        from encoder_runtime.default_fill_mask import default_fill_mask_path

        model = default_fill_mask_path()
    print(json.dumps(evaluate_lama(model, args.data or default_lama_dir(), limit=args.limit)))
