"""``cloze adapt``: adapt a sentence encoder to a corpus without labels (see ``adaptation.run``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from encoder_training.adaptation.recipe import AdaptConfig
from encoder_training.config_options import add_config_options, config_from_args


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    p = groups["cloze"].add_parser(
        "adapt",
        help="adapt an encoder to your corpus without labels: MLM, then contrastive with mined negatives",
        description=(
            "Continued MLM pre-training on the corpus, then contrastive fine-tuning on pairs the corpus "
            "makes (inverse cloze, title/body, crops) with hard negatives mined by the starting encoder, "
            "then interpolation toward the starting weights; the result is kept only if it beats the starting "
            "encoder on pairs held out from training (else a better blend or the starting weights). "
            "Defaults: see encoder_training/adaptation/recipe.py."
        ),
    )
    add_config_options(p, AdaptConfig)
    p.add_argument(
        "--keep-work", action="store_true", help="keep OUT.work (checkpoints, mined pairs) after success"
    )
    p.set_defaults(handler=_adapt)


def _adapt(args: argparse.Namespace) -> None:
    from encoder_training.adaptation.guard import sentence
    from encoder_training.adaptation.run import RECORD, adapt

    config = config_from_args(AdaptConfig, args)
    if not Path(config.corpus).exists():
        raise FileNotFoundError(f"corpus not found: {config.corpus}")
    out = adapt(config, keep_work=args.keep_work)
    record = json.loads((out / RECORD).read_text())
    print(sentence(record["guard"]), file=sys.stderr, flush=True)  # plainly, whatever the log level
    summary = {k: record[k] for k in ("stages", "guard", "seconds_spent")}
    print(json.dumps({"out": str(out), **summary}))
