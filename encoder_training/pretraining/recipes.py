"""Pre-training recipes: YAML files under ``encoder_training/recipes``, every field overridable."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@dataclass
class PretrainConfig:
    objective: str = "mlm"  # mlm | electra
    vocab_size: int = 8192  # only when a tokenizer is trained here
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    block_size: int = 128
    batch_size: int = 32
    grad_accum: int = 1
    learning_rate: float = 5e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    max_steps: int = 1000
    masking: str = "token"  # token | whole_word | span
    mask_rate: float = 0.15
    mask_words: str = "all"  # all | content (no stop words or punctuation) | salient (names only)
    mask_prob: float = 0.8
    random_prob: float = 0.1
    keep_prob: float = 0.1
    generator_fraction: float = 0.25
    disc_weight: float = 50.0
    precision: str = "auto"  # auto | bf16 | fp16 | fp32
    logging_steps: int = 20
    save_steps: int = 500
    seed: int = 42
    heldout_fraction: float = 0.02
    eval_steps: int = 0  # also score the held-out blocks every N steps (0: only at the end)
    init_from: str = ""  # an existing BERT folder ("bundled" = all-MiniLM-L6-v2) to continue from
    train_top_layers: int = 0  # with init_from: train only the top N layers and the MLM head (0 = all)
    max_time_minutes: float = 0.0  # stop after this long (0 = no limit), the learning rate reaching 0 then
    dropout: float = -1.0  # MLM: every dropout probability (hidden and attention); -1 keeps the model's own


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
    """One ``--field-name`` option per recipe field, typed like its default and unset by default."""
    for field in fields(PretrainConfig):
        kind = type(field.default) if field.default is not dataclasses.MISSING else str
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name, type=kind, default=None)
