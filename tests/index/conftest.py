"""Fixtures of the index tests: the tiny random BERT as an encoder (mechanics), small corpora of its words."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from index.records import Document
from index.search_index import SearchIndex
from tests.conftest import TINY_WORDS


@pytest.fixture(scope="session")
def tiny_encoder(tiny_bert: Path):
    from encoder_runtime import load_encoder

    return load_encoder(tiny_bert, backend="torch")


def tiny_documents(count: int, seed: int = 0, words: int = 12) -> list[dict]:
    """Distinct texts over the tiny model's vocabulary, with metadata to filter on."""
    rng = random.Random(seed)
    return [
        {
            "_id": f"d{i}",
            "title": "",
            "text": " ".join(rng.choice(TINY_WORDS) for _ in range(words))
            + f" {TINY_WORDS[i % len(TINY_WORDS)]}",
            "color": ["red", "green", "blue"][i % 3],
            "rank": i,
        }
        for i in range(count)
    ]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def killed(index: SearchIndex) -> None:
    """Leave ``index`` as a SIGKILL leaves a writer: nothing saved or committed past its last snapshot (tantivy's
    writer dropped with the changes it held), and its writer lock gone with the process. Drop the object after."""
    index._live.lexical._writer = None
    if index._lease is not None:
        index._lease.release()


def saved_index(root: Path, encoder: Any, documents: list[Document]) -> Path:
    """An index at ``root`` holding ``documents``, closed (its snapshot saved): its version's folder."""
    index = SearchIndex.open(root, encoder)
    index.upsert(documents)
    folder = index._live.folder
    index.close()
    return folder


@contextmanager
def opened(root: Path, encoder: Any, **options: Any) -> Iterator[SearchIndex]:
    """``SearchIndex.open(root, encoder, **options)``, closed when the block ends, whatever it raised."""
    index = SearchIndex.open(root, encoder, **options)
    try:
        yield index
    finally:
        index.close()
