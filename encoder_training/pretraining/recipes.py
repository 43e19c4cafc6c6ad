"""Pre-training recipes: YAML files under ``encoder_training/recipes``, every field overridable."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from encoder_training.config_options import add_config_options, option

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@dataclass
class PretrainConfig:
    """Every field is a ``--field-name`` option of ``cloze train pretrain``; an option given beats the recipe."""

    objective: str = field(default="mlm", metadata=option("training objective", choices=("mlm", "electra")))
    vocab_size: int = field(
        default=8192, metadata=option("vocabulary, only when a tokenizer is trained here")
    )
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    block_size: int = field(default=128, metadata=option("tokens per training sequence"))
    batch_size: int = 32
    grad_accum: int = field(default=1, metadata=option("batches per optimiser step"))
    learning_rate: float = 5e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    max_steps: int = 1000
    masking: str = field(
        default="token", metadata=option("what one mask covers", choices=("token", "whole_word", "span"))
    )
    mask_rate: float = field(default=0.15, metadata=option("share of the tokens chosen for prediction"))
    mask_words: str = field(
        default="all",
        metadata=option(
            "which words may be masked: all, content (no stop words or punctuation), salient (names only)",
            choices=("all", "content", "salient"),
        ),
    )
    mask_prob: float = field(default=0.8, metadata=option("a chosen token becomes [MASK] this often"))
    random_prob: float = field(default=0.1, metadata=option("... a random token this often"))
    keep_prob: float = field(default=0.1, metadata=option("... stays as it is this often"))
    generator_fraction: float = field(
        default=0.25, metadata=option("ELECTRA: generator size against the discriminator's")
    )
    disc_weight: float = field(default=50.0, metadata=option("ELECTRA: weight of the discriminator's loss"))
    precision: str = field(
        default="auto", metadata=option("autocast precision", choices=("auto", "bf16", "fp16", "fp32"))
    )
    logging_steps: int = 20
    save_steps: int = field(
        default=500, metadata=option("checkpoint every N steps (what --resume continues from)")
    )
    seed: int = 42
    heldout_fraction: float = field(
        default=0.02, metadata=option("share of the text held out for the loss check")
    )
    init_from: str = field(
        default="", metadata=option('an existing BERT folder to continue from ("bundled" = all-MiniLM-L6-v2)')
    )
    train_top_layers: int = field(
        default=0, metadata=option("with --init-from: train only the top N layers and the MLM head (0 = all)")
    )
    max_time_minutes: float = field(
        default=0.0, metadata=option("stop after this long (0 = no limit), the learning rate reaching 0 then")
    )
    dropout: float = field(
        default=-1.0,
        metadata=option("MLM: every dropout probability (hidden and attention); -1 keeps the model's own"),
    )


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def load_recipe(name_or_path: str, overrides: dict | None = None) -> PretrainConfig:
    """A recipe by name (``tiny-cpu``) or YAML path, then non-None overrides on top."""
    path = Path(name_or_path)
    if not path.is_file():
        path = RECIPES / f"{name_or_path}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"unknown recipe {name_or_path!r}; known: {', '.join(recipe_names())}")
    values = yaml.safe_load(path.read_text()) or {}
    known = {f.name for f in fields(PretrainConfig)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"{path}: unknown fields {sorted(unknown)}")
    values.update({k: v for k, v in (overrides or {}).items() if v is not None and k in known})
    return PretrainConfig(**values)


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--field-name`` option per recipe field, unset unless given (the recipe holds the defaults)."""
    add_config_options(parser, PretrainConfig, overrides=True)
