"""Judged queries in: a BEIR-layout folder with a named split, or JSONL pairs (``query``, ``positive``) and an
optional corpus. Either way each query ends up with its text and the documents judged relevant to it, named
by corpus id where the corpus has them (mining excludes those ids; the dev check scores by them)."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.beir import corpus_file, load_qrels, load_queries
from index.build.ingest import iter_documents


@dataclass
class Positive:
    text: str
    doc_id: str | None = None  # None: a pairs file's passage that is not in the corpus


@dataclass
class JudgedQuery:
    query_id: str
    text: str
    positives: list[Positive] = field(default_factory=list)

    def positive_ids(self) -> set[str]:
        return {p.doc_id for p in self.positives if p.doc_id is not None}

    def positive_texts(self) -> set[str]:
        return {normalized(p.text) for p in self.positives}


def normalized(text: str) -> str:
    """Whitespace-insensitive text identity: a pairs file's passage vs. the index's copy of it."""
    return re.sub(r"\s+", " ", text).strip()


def read_beir(folder: Path, split: str) -> tuple[list[JudgedQuery], Path]:
    """Queries with a relevance > 0 judgement in ``qrels/<split>.tsv``; their positives' text as the index
    stores it (BEIR's title in front of the body)."""
    folder = Path(folder)
    qrels = load_qrels(folder, split)
    texts = load_queries(folder)
    wanted = {doc for docs in qrels.values() for doc, grade in docs.items() if grade > 0}
    corpus = corpus_file(folder)
    documents = {doc.id: doc.text for doc in iter_documents(corpus) if doc.id in wanted}
    queries = []
    for query_id, docs in qrels.items():
        positives = [Positive(documents[d], d) for d, grade in docs.items() if grade > 0 and d in documents]
        if positives and query_id in texts:
            queries.append(JudgedQuery(query_id, texts[query_id], positives))
    return queries, corpus


def read_pairs(path: Path, corpus: Path | None, work: Path) -> tuple[list[JudgedQuery], Path]:
    """JSONL rows ``{"query": ..., "positive": ...}`` (optionally ``positive_id``), grouped by query text. A
    positive is matched to a corpus document by id, else by its text. Without a corpus, the positives
    themselves are the corpus (written to ``work/corpus.jsonl``)."""
    rows = list(_jsonl(Path(path)))
    if not rows:
        raise ValueError(f"{path}: no pairs")
    for number, row in enumerate(rows, start=1):
        if not row.get("query") or not row.get("positive"):
            raise ValueError(f"{path}: row {number} needs non-empty 'query' and 'positive' fields")
    if corpus is None:
        corpus = _positives_as_corpus(rows, work)
    ids_by_text = {normalized(doc.text): doc.id for doc in iter_documents(corpus)}
    by_query: dict[str, JudgedQuery] = {}
    for row in rows:
        query = by_query.setdefault(row["query"], JudgedQuery(f"q{len(by_query)}", row["query"]))
        doc_id = row.get("positive_id")
        query.positives.append(
            Positive(row["positive"], str(doc_id) if doc_id else ids_by_text.get(normalized(row["positive"])))
        )
    return list(by_query.values()), Path(corpus)


def _positives_as_corpus(rows: list[dict], work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    out = work / "corpus.jsonl"
    texts = dict.fromkeys(normalized(row["positive"]) for row in rows)
    with out.open("w", encoding="utf-8") as handle:
        for number, text in enumerate(texts):
            handle.write(json.dumps({"_id": f"p{number}", "text": text}) + "\n")
    return out


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)
