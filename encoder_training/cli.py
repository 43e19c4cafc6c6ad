"""Sub-commands of the training stage, registered into the groups of ``app.cli``.

Pre-training (``cloze train tokenizer|pretrain``, ``cloze eval mlm|lama``) and fine-tuning
(``cloze train finetune``, ``cloze eval sts``) each register their own.
"""

from __future__ import annotations

import argparse

from encoder_training.finetuning import cli as finetuning_cli
from encoder_training.pretraining import cli as pretraining_cli


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    pretraining_cli.register(groups)
    finetuning_cli.register(groups)
