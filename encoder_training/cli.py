"""Sub-commands of the training stage, registered into the groups of ``app.cli``: pre-training
(``cloze train tokenizer|pretrain``), fine-tuning (``cloze train finetune``), rerankers
(``cloze train reranker``), adaptation
(``cloze adapt``) and pre-training's own evaluator (``cloze eval mlm``); the others are ``evaluation.cli``'s."""

from __future__ import annotations

import argparse

from encoder_training.adaptation import cli as adaptation_cli
from encoder_training.finetuning import cli as finetuning_cli
from encoder_training.pretraining import cli as pretraining_cli
from encoder_training.reranking import cli as reranking_cli


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    pretraining_cli.register(groups)
    finetuning_cli.register(groups)
    adaptation_cli.register(groups)
    reranking_cli.register(groups)
