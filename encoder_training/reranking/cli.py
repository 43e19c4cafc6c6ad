"""``cloze train reranker``: train a cross-encoder on judged queries (see ``reranking.train``)."""

from __future__ import annotations

import argparse
import json
import sys

from encoder_training.config_options import add_config_options, config_from_args
from encoder_training.reranking.config import RerankConfig


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
    add_config_options(p, RerankConfig)
    p.set_defaults(handler=_train_reranker)


def _train_reranker(args: argparse.Namespace) -> None:
    from encoder_training.reranking.train import TRAINING_RECORD, dev_warning, train_reranker

    config = config_from_args(RerankConfig, args)
    try:
        out = train_reranker(config)
    except ValueError as exc:
        raise SystemExit(f"cloze train reranker: {exc}") from exc
    record = json.loads((out / TRAINING_RECORD).read_text())
    if warning := dev_warning(record["dev"]):
        print(f"cloze train reranker: warning: {warning}", file=sys.stderr)
    print(json.dumps({"out": str(out), "training": record["training"], "dev": record["dev"]}))
