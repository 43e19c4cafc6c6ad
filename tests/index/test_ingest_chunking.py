"""Corpus readers agree across formats; chunk windows respect the encoder's limit and cover every token."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from index.build.ingest import corpus_checksum, iter_documents
from index.text.chunking import Chunker
from tests.conftest import TINY_WORDS


def test_every_format_yields_the_same_documents(tmp_path: Path) -> None:
    records = [
        {"_id": "a", "title": "T", "text": "body one", "lang": "en"},
        {"_id": "b", "title": "", "text": "two", "lang": "fr"},
    ]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl.read_bytes()))
    with (tmp_path / "c.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "c.parquet")
    expected = [(d.id, d.text, d.metadata) for d in iter_documents(jsonl)]
    assert expected[0] == ("a", "T\n\nbody one", {"title": "T", "lang": "en"})
    assert expected[1][:2] == ("b", "two")
    for path in (gz, tmp_path / "c.csv", tmp_path / "c.parquet"):
        assert [(d.id, d.text, d.metadata) for d in iter_documents(path)] == expected, path


def test_plain_ids_beir_metadata_and_folders(tmp_path: Path) -> None:
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"id": 7, "text": "x", "metadata": {"k": 1}}\n{"text": "no id"}\n')
    docs = list(iter_documents(plain))
    assert [(d.id, d.metadata) for d in docs] == [("7", {"k": 1}), ("1", {})]
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.md").write_text("# A\nalpha")
    (folder / "sub" / "b.txt").write_text("beta")
    (folder / "skip.bin").write_bytes(b"\0")
    assert [(d.id, d.text) for d in iter_documents(folder)] == [("a.md", "# A\nalpha"), ("sub/b.txt", "beta")]
    before = corpus_checksum(folder)
    (folder / "a.md").write_text("# A\nalpha!")
    assert corpus_checksum(folder) != before


def test_windows_fit_overlap_and_cover_the_text(tiny_encoder) -> None:
    chunker = Chunker.for_encoder(tiny_encoder, overlap=8)
    assert chunker.window == tiny_encoder.max_tokens - 2
    text = " ".join(TINY_WORDS[i % len(TINY_WORDS)] for i in range(300))
    short = "the cat sat"
    long_chunks, short_chunks = chunker.split([text, short])
    assert [c.text for c in short_chunks] == [short]
    assert len(long_chunks) > 4
    for chunk in long_chunks:
        assert chunk.text in text
        assert chunk.tokens <= chunker.window
        assert len(tiny_encoder.encode([chunk.text])[0]) <= tiny_encoder.max_tokens  # never truncated
    assert long_chunks[0].text.startswith("the") and text.endswith(long_chunks[-1].text)
    first, second = long_chunks[0].text.split(), long_chunks[1].text.split()
    assert first[-8:] == second[:8]  # consecutive windows share `overlap` tokens (one word = one token here)
