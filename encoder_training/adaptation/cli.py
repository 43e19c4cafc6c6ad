"""``cloze adapt``: adapt a sentence encoder to a corpus without labels (see ``adaptation.run``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from encoder_training.adaptation.recipe import AdaptConfig

HELP = {
    "model": "encoder folder to start from (default: the bundled all-MiniLM-L6-v2)",
    "corpus": "the documents: JSONL / CSV / TSV / Parquet / folder of .txt, or an index folder",
    "out": "output sentence-transformers folder (work files go to OUT.work; rerun to resume)",
    "max_time_minutes": "wall-clock budget of the whole run",
    "stages": "mlm contrastive (default: both)",
    "pair_kinds": "ict title crop (one kind per document per round)",
    "general_pairs": "optional general pairs mixed into the contrastive stage (named sets or JSONL/TSV)",
    "distill_weight": "weight of the pull toward the starting encoder's embeddings during the contrastive stage (0: off)",
    "mlm_distill_weight": (
        "weight of the pull of each MLM block's embedding toward the starting encoder's (0: plain MLM)"
    ),
    "lexical_teacher_weight": (
        "train toward a hybrid teacher: the starting encoder's cosine plus this weight times normalised BM25 "
        "(0: MNRL's one-hot target)"
    ),
    "interpolate": "weight of the adapted model against the starting one (1.0: no interpolation)",
    "mine_negatives": "mine hard negatives (true/false)",
    "prep_fraction": "share of the budget mining and the starting encoder's embeddings may take; beyond it, a "
    "random subset of the pairs that fits is trained on",
    "max_steps_per_stage": "also end each training stage after this many steps: a short run that does the same "
    "work on any machine",
    "guard_pairs": (
        "pairs held out from training (at most a fifth) on which the result must beat the starting encoder, "
        "else a better blend or the starting weights are kept (0: no check)"
    ),
    "guard_alphas": "the other blend weights the check tries when the --interpolate blend does not beat the start",
    "teacher": "a cross-encoder (sentence-transformers CrossEncoder folder) whose score margins on the mined "
    "rows train the encoder with MarginMSE (GPL), and whose grades join the check",
    "teacher_mode": "beside: MarginMSE beside MNRL's in-batch negatives; instead: MarginMSE alone",
    "teacher_fraction": "share of the budget the teacher may spend scoring training rows",
}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


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
    defaults = AdaptConfig()
    for field in fields(AdaptConfig):
        name = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        kwargs: dict = {"dest": field.name, "help": HELP.get(field.name, "")}
        if isinstance(default, list):
            kwargs.update(nargs="+", default=list(default))
            if default and isinstance(default[0], float):
                kwargs["type"] = float
        elif isinstance(default, bool):
            kwargs.update(type=_bool, default=default)
        elif field.name in ("max_documents", "max_steps_per_stage", "mine_max_score"):
            kwargs.update(type=float if field.name == "mine_max_score" else int, default=None)
        else:
            kwargs.update(type=type(default), default=default)
        if field.name in ("corpus", "out"):
            kwargs.update(required=True)
            kwargs.pop("default")
        kwargs["help"] = f"{kwargs['help']} (default: {default})".strip()
        p.add_argument(name, **kwargs)
    p.add_argument(
        "--keep-work", action="store_true", help="keep OUT.work (checkpoints, mined pairs) after success"
    )
    p.set_defaults(handler=_adapt)


def _adapt(args: argparse.Namespace) -> None:
    from encoder_training.adaptation.guard import sentence
    from encoder_training.adaptation.run import RECORD, adapt

    values = {f.name: getattr(args, f.name) for f in fields(AdaptConfig)}
    if not Path(values["corpus"]).exists():
        raise FileNotFoundError(f"corpus not found: {values['corpus']}")
    out = adapt(AdaptConfig(**values), keep_work=args.keep_work)
    record = json.loads((out / RECORD).read_text())
    print(sentence(record["guard"]), file=sys.stderr, flush=True)  # plainly, whatever the log level
    summary = {k: record[k] for k in ("stages", "guard", "seconds_spent")}
    print(json.dumps({"out": str(out), **summary}))
