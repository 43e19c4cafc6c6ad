"""``cloze train reranker``: train a cross-encoder on judged queries (see ``reranking.train``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from encoder_training.reranking.config import LOSSES, RerankConfig

HELP = {
    "out": "output CrossEncoder folder (work files go to OUT.work; rerun to resume)",
    "beir": "a BEIR-layout folder (corpus.jsonl[.gz], queries.jsonl, qrels/SPLIT.tsv)",
    "split": "the BEIR qrels split to train on",
    "pairs": 'JSONL of judged pairs: {"query": ..., "positive": ...} (optional "positive_id")',
    "corpus": "the documents negatives are mined from (with --pairs; default: the positives themselves)",
    "model": "starting weights: any BERT-style folder (default: the bundled encoder's, with a new head)",
    "encoder": "the first stage's encoder for mining (default: the bundled one)",
    "backend": "the first stage encoder's backend",
    "index": "an existing index over the corpus to mine from (opened read-only; default: build one in OUT.work)",
    "loss": "bce: pointwise with hard negatives; mnrl: listwise over hard and in-batch negatives",
    "num_negatives": "hard negatives per query",
    "range_min": "skip this many top first-stage candidates outright",
    "range_max": "first-stage candidates looked at per query",
    "relative_margin": "false-negative guard: skip a candidate whose dense score is above (1 - margin) x the "
    "positive's (0: off)",
    "max_length": "tokens of query + passage (the passage side is cut)",
    "max_time_minutes": "wall-clock budget of the training stage (mining and the dev check come on top)",
    "max_steps": "also stop after this many steps (0: the clock decides)",
    "save_steps": "checkpoint every N steps (what a rerun resumes from)",
    "dev_queries": "judged queries held out for the dev check (at most a fifth)",
    "dev_candidates": "first-stage candidates the dev check reranks",
    "min_epochs": "refuse to train when the budget buys fewer epochs than this (a few steps are timed first)",
    "force": "train even when the budget buys fewer than --min-epochs",
}


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    p = groups["train"].add_parser(
        "reranker",
        help="train a cross-encoder reranker on judged queries, negatives mined by hybrid search",
        description=(
            "Judged (query, positive) pairs or a BEIR split in; hard negatives from the service's hybrid "
            "search over the corpus, guarded against unjudged positives; the sentence-transformers "
            "cross-encoder trainer under a time budget (rerun to resume); a CrossEncoder folder with "
            "training.json and a model card with its dev scores out."
        ),
    )
    defaults = RerankConfig(out="")
    for field in fields(RerankConfig):
        name = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        kwargs: dict = {"dest": field.name, "help": HELP.get(field.name, "")}
        if field.name == "out":
            kwargs["required"] = True
        elif field.name == "loss":
            kwargs.update(choices=LOSSES, default=default)
        elif field.name == "backend":
            kwargs.update(choices=["auto", "torch", "onnx", "onnx-int8"], default=default)
        elif isinstance(default, bool):
            kwargs.update(action="store_true", default=default)
        elif isinstance(default, (int, float)):
            kwargs.update(type=type(default), default=default)
        else:
            kwargs["default"] = default
        p.add_argument(name, **kwargs)
    p.set_defaults(handler=_train_reranker)


def _train_reranker(args: argparse.Namespace) -> None:
    from encoder_training.reranking.train import TRAINING_RECORD, dev_warning, train_reranker

    config = RerankConfig(**{f.name: getattr(args, f.name) for f in fields(RerankConfig)})
    try:
        out = train_reranker(config)
    except ValueError as exc:
        raise SystemExit(f"cloze train reranker: {exc}") from exc
    record = json.loads((out / TRAINING_RECORD).read_text())
    if warning := dev_warning(record["dev"]):
        print(f"cloze train reranker: warning: {warning}", file=sys.stderr)
    print(json.dumps({"out": str(out), "training": record["training"], "dev": record["dev"]}))
