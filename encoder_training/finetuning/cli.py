"""``cloze train finetune``: SBERT siamese fine-tuning.

Named training sets are read from a data folder (``evaluation.data_folder``); a user's own JSONL /
TSV pairs need no data folder at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from encoder_training.config_options import add_config_options, config_from_args
from encoder_training.finetuning.config import FinetuneConfig
from evaluation.data_folder import default_data_dir


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    _add_finetune(groups["train"])


def _add_finetune(train: argparse._SubParsersAction) -> None:
    p = train.add_parser("finetune", help="SBERT siamese fine-tuning of any encoder folder")
    add_config_options(p, FinetuneConfig)
    p.set_defaults(handler=_finetune)


def _finetune(args: argparse.Namespace) -> None:
    from encoder_training.finetuning.train import TRAINING_RECORD, finetune

    config = config_from_args(FinetuneConfig, args)
    out = finetune(dataclasses.replace(config, data_dir=config.data_dir or str(default_data_dir())))
    record = json.loads((out / TRAINING_RECORD).read_text())
    summary = {k: record[k] for k in ("steps", "wall_time_s", "data", "sts_dev")}
    print(json.dumps({"out": str(out), **summary}))
