"""Trainers' command lines are generated from their config dataclasses: the generator's rules, and that every
option the docs show still parses to the config it means."""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.cli import build_parser
from encoder_training.adaptation.recipe import AdaptConfig
from encoder_training.config_options import add_config_options, comma_list, config_from_args, option
from encoder_training.finetuning.config import FinetuneConfig
from encoder_training.pretraining.recipes import PretrainConfig, load_recipe
from encoder_training.reranking.config import RerankConfig

ROOT = Path(__file__).resolve().parents[2]
TRAINERS = {
    "cloze train pretrain": ("train", "pretrain"),
    "cloze train finetune": ("train", "finetune"),
    "cloze train reranker": ("train", "reranker"),
    "cloze adapt": ("adapt",),
}


@dataclass
class Toy:
    out: str = field(metadata=option("where it goes"))
    rate: float = field(default=0.5, metadata=option("50% of it"))
    steps: int | None = None
    kinds: list[str] = field(default_factory=lambda: ["a"])
    alphas: list[float] = field(default_factory=list)
    columns: list[str] | None = field(default=None, metadata=option(parse=comma_list))
    normalize: bool = True
    mode: str = field(default="x", metadata=option(choices=("x", "y")))
    learning_rate: float = field(default=1e-3, metadata=option(flags=("--lr", "--learning-rate")))


def _toy_parser(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_options(parser, Toy, **kwargs)
    return parser


def test_defaults_types_and_lists_come_from_the_dataclass() -> None:
    toy = config_from_args(Toy, _toy_parser().parse_args(["--out", "o"]))
    assert toy == Toy(out="o")
    toy = config_from_args(
        Toy,
        _toy_parser().parse_args(
            ["--out", "o", "--rate", "0.25", "--steps", "3", "--kinds", "b", "c", "--alphas", "0.1", "1"]
            + ["--columns", "q,p", "--mode", "y", "--lr", "2e-5"]
        ),
    )
    assert toy == Toy("o", 0.25, 3, ["b", "c"], [0.1, 1.0], ["q", "p"], True, "y", 2e-5)
    assert _toy_parser().parse_args(["--out", "o", "--learning-rate", "1"]).learning_rate == 1.0


def test_bad_values_and_missing_required_fields_are_refused() -> None:
    for argv in (["--rate", "1"], ["--out", "o", "--rate", "half"], ["--out", "o", "--mode", "z"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            _toy_parser().parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], True), (["--normalize"], True), (["--no-normalize"], False), (["--normalize", "false"], False)]
    + [(["--normalize", "on"], True), (["--normalize", "0"], False)],
)
def test_bools_are_dash_x_and_no_x_and_still_take_a_word(argv: list[str], expected: bool) -> None:
    assert _toy_parser().parse_args(["--out", "o", *argv]).normalize is expected


def test_a_bool_refuses_a_word_it_does_not_know() -> None:
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _toy_parser().parse_args(["--out", "o", "--normalize", "maybe"])


def test_help_comes_from_metadata_with_the_default() -> None:
    text = _toy_parser().format_help()
    assert "where it goes" in text and "50% of it (default: 0.5)" in text
    assert "--no-normalize turns it off" in text


def test_overrides_leave_every_option_unset_and_none_required() -> None:
    args = _toy_parser(overrides=True).parse_args(["--rate", "0.1"])
    assert args.out is None and args.steps is None and args.normalize is None and args.rate == 0.1


def _subparser(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _parse(command: str) -> argparse.Namespace:
    words = shlex.split(command)
    return build_parser().parse_args(words[1:])


def test_each_trainer_has_an_option_for_every_config_field() -> None:
    for names, config in (
        (("train", "pretrain"), PretrainConfig),
        (("train", "finetune"), FinetuneConfig),
        (("train", "reranker"), RerankConfig),
        (("adapt",), AdaptConfig),
    ):
        dests = {action.dest for action in _subparser(*names)._actions}
        assert {f.name for f in config.__dataclass_fields__.values()} <= dests, names


def test_documented_pretrain_command_overrides_the_recipe() -> None:
    args = _parse(
        "cloze train pretrain --recipe tiny-cpu --objective electra --input my-corpus/ --out runs/mlm "
        "--max-time-minutes 30 --masking whole_word --learning-rate 1e-4"
    )
    config = load_recipe(args.recipe, vars(args))
    recipe = load_recipe("tiny-cpu")
    assert (config.objective, config.max_time_minutes, config.masking) == ("electra", 30.0, "whole_word")
    assert config.learning_rate == 1e-4 and config.hidden_size == recipe.hidden_size
    assert load_recipe("tiny-cpu", vars(_parse("cloze train pretrain --input x --out y"))) == recipe


def test_documented_finetune_command_parses_to_its_config() -> None:
    args = _parse(
        "cloze train finetune --model runs/mlm --pairs pairs.jsonl --columns anchor,positive --loss mnrl "
        "--out runs/sbert --lr 3e-5 --no-normalize --matryoshka-dims 384 128 --max-seq-length 128"
    )
    assert config_from_args(FinetuneConfig, args) == FinetuneConfig(
        model="runs/mlm",
        out="runs/sbert",
        pairs=["pairs.jsonl"],
        columns=["anchor", "positive"],
        learning_rate=3e-5,
        normalize=False,
        matryoshka_dims=[384, 128],
        max_seq_length=128,
    )


def test_documented_reranker_commands_parse_to_their_config() -> None:
    args = _parse(
        "cloze train reranker --pairs judged.jsonl --corpus docs.jsonl --out models/my-reranker "
        "--max-time-minutes 60 --loss mnrl --relative-margin 0.1"
    )
    assert config_from_args(RerankConfig, args) == RerankConfig(
        out="models/my-reranker",
        pairs="judged.jsonl",
        corpus="docs.jsonl",
        max_time_minutes=60.0,
        loss="mnrl",
        relative_margin=0.1,
    )
    args = _parse("cloze train reranker --beir data/scifact --split train --out models/scifact-reranker")
    assert config_from_args(RerankConfig, args) == RerankConfig(
        out="models/scifact-reranker", beir="data/scifact"
    )


def test_documented_adapt_commands_parse_to_their_config() -> None:
    args = _parse(
        "cloze adapt --corpus docs.jsonl --out models/adapted --max-time-minutes 60 --pair-kinds ict title "
        "--mine-negatives false --guard-alphas 0.5 1 --teacher models/r --teacher-mode instead --keep-work"
    )
    assert args.keep_work
    assert config_from_args(AdaptConfig, args) == AdaptConfig(
        corpus="docs.jsonl",
        out="models/adapted",
        max_time_minutes=60.0,
        pair_kinds=["ict", "title"],
        mine_negatives=False,
        guard_alphas=[0.5, 1.0],
        teacher="models/r",
        teacher_mode="instead",
    )
    assert not _parse("cloze adapt --corpus c --out o --no-mine-negatives").mine_negatives


def _documented_commands() -> list[tuple[str, str]]:
    """Every trainer command line the README and docs/ show: whole lines in code blocks (continuations
    joined), the backticked span in prose."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        in_code = False
        text = re.sub(r"\\\n\s*", " ", page.read_text())
        for line in text.splitlines():
            if line.startswith("```"):
                in_code = not in_code
                continue
            spans = [line] if in_code else re.findall(r"`([^`]+)`", line)
            for span in spans:
                for trainer in TRAINERS:
                    if trainer in span:
                        found.append((trainer, span.split(trainer, 1)[1]))
    return found


def test_every_documented_trainer_option_exists() -> None:
    commands = _documented_commands()
    assert {trainer for trainer, _ in commands} == set(TRAINERS), "the docs stopped showing a trainer"
    unknown = []
    for trainer, rest in commands:
        known = _subparser(*TRAINERS[trainer])._option_string_actions
        unknown += [
            f"{trainer} {flag}"
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
            if flag not in known
        ]
    assert not unknown
