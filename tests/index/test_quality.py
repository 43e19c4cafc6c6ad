"""Real quality on a SciFact slice with the bundled MiniLM: dense, BM25 and their fusion all retrieve well.

The full-corpus figures (nDCG@10 on 5,183 abstracts) are a benchmark (``cloze eval beir``); this slice of
judged documents plus distractors keeps the test to seconds while still failing on a broken pipeline.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from evaluation.beir import evaluate_beir, load_qrels, load_queries

QUERIES = 20
DISTRACTORS = 60


def scifact_slice(shared: Path, out: Path) -> Path:
    source = shared / "beir-scifact"
    qrels = dict(list(load_qrels(source).items())[:QUERIES])
    wanted = {doc for judged in qrels.values() for doc in judged}
    queries = load_queries(source)
    corpus, distractors = [], 0
    with gzip.open(source / "corpus.jsonl.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record["_id"] in wanted or distractors < DISTRACTORS:
                distractors += record["_id"] not in wanted
                corpus.append(line)
    (out / "qrels").mkdir(parents=True)
    (out / "corpus.jsonl").write_text("".join(corpus))
    (out / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": queries[q]}) + "\n" for q in qrels)
    )
    rows = [f"{q}\t{d}\t{s}" for q, judged in qrels.items() for d, s in judged.items()]
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return out


@pytest.mark.slow  # whole-model exports, Ray, subprocess kills or real data: make test, not test-fast
def test_dense_bm25_hybrid_on_a_scifact_slice(tmp_path: Path, shared_data: Path, bundled_torch) -> None:
    data = scifact_slice(shared_data, tmp_path / "scifact-slice")
    results = {
        mode: evaluate_beir(data, bundled_torch, mode, "torch", tmp_path / "index", show_progress=False)
        for mode in ("dense", "bm25", "hybrid")
    }
    for mode, result in results.items():
        assert result["queries"] == QUERIES and result["mode"] == mode
        assert result["ndcg@10"] >= 0.6, (mode, result)
        assert result["recall@100"] >= 0.9, (mode, result)
    assert results["hybrid"]["ndcg@10"] >= min(results["dense"]["ndcg@10"], results["bm25"]["ndcg@10"])
    assert results["dense"]["chunks"] > results["dense"]["documents"]  # long abstracts were windowed
