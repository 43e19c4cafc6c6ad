"""Shared fixtures: a tiny random-weight BERT for fast mechanics, the bundled real model for quality."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TINY_WORDS = (
    "the a an is was of to in and on at for with cat dog mat sat paris france capital city river "
    "king queen man woman play plays playing guitar music read book long short sentence word words"
).split()


def make_tiny_bert(out: Path, max_position_embeddings: int = 64) -> Path:
    """A 2-layer BERT with an MLM head and random weights: fast, deterministic, worthless for quality."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    out.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *TINY_WORDS, *[f"##{c}" for c in "sedn"]]
    tokenizer = BertTokenizer(
        vocab={token: i for i, token in enumerate(vocab)}, model_max_length=max_position_embeddings
    )
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_position_embeddings,
    )
    BertForMaskedLM(config).eval().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def bundled_path() -> Path:
    from encoder_runtime.model_dir import bundled_model_path

    return bundled_model_path()


@pytest.fixture(scope="session")
def bundled_torch():
    """The real all-MiniLM-L6-v2 on the torch backend, loaded once."""
    from encoder_runtime import load_encoder

    return load_encoder(backend="torch")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"tests read real data from {SHARED_DATA}"
    return SHARED_DATA


def sts_sentences(shared: Path, limit: int) -> list[str]:
    sentences: list[str] = []
    for line in (shared / "stsbenchmark" / "sts-test.csv").read_text().splitlines():
        fields = line.split("\t")
        sentences += fields[5:7]
    return sentences[:limit]
