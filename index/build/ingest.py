"""Read a corpus as a stream of ``Document``: JSONL (BEIR or plain), CSV/TSV, Parquet, a folder of .txt/.md.

Streaming keeps memory bounded by one record, whatever the corpus size; gzip is recognised by suffix.
A BEIR ``title`` is kept in the metadata and also put in front of the text, because both BM25 and the
encoder score a document better with its title (BEIR's own evaluation concatenates them the same way).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from index.records import Document, check_document

_ID_KEYS = ("_id", "id", "doc_id", "docid")
_TEXT_KEYS = ("text", "body", "contents", "content", "passage", "abstract")
_FOLDER_SUFFIXES = (".txt", ".md")


def iter_documents(path: str | Path) -> Iterator[Document]:
    """Every document of ``path`` in a stable order (resume relies on that order)."""
    path = Path(path)
    if path.is_dir():
        yield from _folder(path)
        return
    if not path.is_file():
        raise FileNotFoundError(f"corpus not found: {path}")
    kind = _kind(path)
    if kind == "parquet":
        yield from _parquet(path)
        return
    with _open_text(path) as handle:
        rows = _jsonl(handle) if kind == "jsonl" else _csv(handle, "\t" if kind == "tsv" else ",")
        for number, row in enumerate(rows):
            yield record_to_document(row, str(number))


def corpus_checksum(path: str | Path) -> str:
    """SHA-256 of the corpus bytes (for a folder: of its file names and bytes), for ``--skip-if-current``."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(_folder_files(path)) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:32]


def record_to_document(row: dict[str, Any], fallback_id: str) -> Document:
    """Map one record's fields: id and text by their usual names, everything else kept as metadata."""
    doc_id = next((str(row[key]) for key in _ID_KEYS if row.get(key) not in (None, "")), fallback_id)
    text_key = next((key for key in _TEXT_KEYS if key in row), None)
    if text_key is None:
        raise ValueError(f"record {doc_id!r} has no text field (one of {', '.join(_TEXT_KEYS)})")
    body = "" if row[text_key] is None else str(row[text_key])
    metadata: dict[str, Any] = {}
    for key, value in row.items():
        if key in _ID_KEYS or key == text_key:
            continue
        if key == "metadata" and isinstance(value, dict):
            metadata.update(value)
        else:
            metadata[key] = value
    title = str(metadata.get("title") or "").strip()
    text = f"{title}\n\n{body}" if title and body else (title or body)
    document = Document(id=doc_id, text=text, metadata=metadata)
    check_document(document)
    return document


def _kind(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    last = suffixes[-1] if suffixes else ""
    return {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv"}.get(last, "jsonl")


def _open_text(path: Path) -> IO[str]:
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def _jsonl(handle: IO[str]) -> Iterator[dict[str, Any]]:
    for line in handle:
        if line.strip():
            yield json.loads(line)


def _csv(handle: IO[str], delimiter: str) -> Iterator[dict[str, Any]]:
    csv.field_size_limit(1 << 30)
    yield from csv.DictReader(handle, delimiter=delimiter)


def _parquet(path: Path) -> Iterator[Document]:
    import pyarrow.parquet as pq

    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=2048):
        for row in batch.to_pylist():
            yield record_to_document(row, str(number))
            number += 1


def _folder_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in _FOLDER_SUFFIXES)


def _folder(root: Path) -> Iterator[Document]:
    for file in _folder_files(root):
        relative = file.relative_to(root).as_posix()
        yield Document(
            id=relative, text=file.read_text(encoding="utf-8", errors="replace"), metadata={"path": relative}
        )
