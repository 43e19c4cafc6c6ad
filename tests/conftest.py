"""Shared fixtures: a tiny random-weight BERT for fast mechanics, the bundled real model for quality."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from harness.data import SHARED_DATA  # noqa: E402
from harness.tiny_model import TINY_WORDS, make_tiny_bert  # noqa: E402, F401


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


@pytest.fixture(scope="session")
def tiny_cross_encoder(tiny_bert, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cross-encoder folder over the tiny BERT, random classifier: the reranker's mechanics."""
    from harness.tiny_model import make_tiny_cross_encoder

    return make_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder"), tiny_bert)


@pytest.fixture(scope="session")
def small_reranker() -> Path:
    """The bundled MiniLM as a cross-encoder trained on a handful of judged pairs (harness.rerankers): its
    scores order those pairs; trained once and cached across sessions."""
    from harness.rerankers import small_reranker as build

    return build()
