"""Filtered search at scale: latency of filtered against unfiltered search, and recall@10 against exact.

The ``index_scale`` corpus (real prose passages, ``benchmarks/index_scale.py``), each document given synthetic
metadata at build time so the filters' selectivities are exact: ``bucket``, an integer 0..999 (a seeded
permutation of ``i % 1000``, so each value holds exactly 1/1000 of the documents) and ``date``, an ISO date
2020-01-01 + (an independent permutation of ``i % 1000``) days. The filters:

- 0.1%: ``{"bucket": 7}`` (typed equality);
- 10%: ``{"bucket": {"$lt": 100}}`` (a numeric range);
- 90%: ``{"date": {"$gte": "2020-04-10"}}`` (a date range: days 100..999).

Per factory (IVF and IVF-PQ at their default search settings, swapped onto the same opened index, FAISS
built once from the stored vectors and cached) and per mode (dense, BM25, hybrid): p50 / p99 of
``SearchIndex.search`` in-process (query vectors embedded once up front), filtered and unfiltered, and
recall@10 of the returned documents against the same search and filter over an exact ``IDMap2,Flat``
index of the same vectors.

    nice -n 10 .venv/bin/python benchmarks/filtered_search.py --passages 100000 --index-dir /tmp/cloze-filtered
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.index_scale import split_sentences, write_corpus  # noqa: E402
from harness.provenance import command  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
FILTERS = {
    "0.1%": {"bucket": 7},
    "10%": {"bucket": {"$lt": 100}},
    "90%": {"date": {"$gte": "2020-04-10"}},
}
MODES = ("dense", "bm25", "hybrid")
EXACT = "IDMap2,Flat"


def with_metadata(plain: Path, out: Path, seed: int = 1) -> None:
    """``plain`` (index_scale's JSONL) with ``bucket`` and ``date`` added to every record."""
    lines = gzip.open(plain, "rt", encoding="utf-8").read().splitlines()
    rng = random.Random(seed)
    buckets = [i % 1000 for i in range(len(lines))]
    days = list(buckets)
    rng.shuffle(buckets)
    rng.shuffle(days)
    base = np.datetime64("2020-01-01")
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=1) as handle:
        for line, bucket, day in zip(lines, buckets, days, strict=True):
            record = json.loads(line) | {"bucket": bucket, "date": str(base + np.timedelta64(day, "D"))}
            handle.write(json.dumps(record) + "\n")


def build(args, encoder) -> dict:
    """The index under ``--index-dir`` (built once; reused when its manifest is there)."""
    from index import layout
    from index.builder import BuildOptions, build_from_input

    root = args.index_dir / "index"
    if layout.current_version(root) is not None:
        return json.loads((args.index_dir / "build.json").read_text())
    args.index_dir.mkdir(parents=True, exist_ok=True)
    plain, corpus = args.index_dir / "plain.jsonl.gz", args.index_dir / "corpus.jsonl.gz"
    write_corpus(plain, args.passages, (1, 2))
    with_metadata(plain, corpus)
    started = time.perf_counter()
    manifest = build_from_input(
        root, corpus, encoder, BuildOptions(factory=args.factories.split(";")[0], show_progress=False)
    )
    info = {
        "passages": args.passages,
        "chunks": manifest["chunks"],
        "build_seconds": round(time.perf_counter() - started, 1),
        "stage_seconds": manifest["stage_seconds"],
    }
    (args.index_dir / "build.json").write_text(json.dumps(info))
    return info


def vectors_for(args, store, dimension: int, factory: str):
    """The FAISS index of ``factory`` over the stored vectors, cached beside the index."""
    import faiss

    from index.builder import build_vectors
    from index.vectors import VectorIndex, default_params

    path = args.index_dir / f"vectors-{factory.replace(',', '_')}.faiss"
    if path.exists():
        return VectorIndex(faiss.read_index(str(path)), factory, default_params(factory))
    index = build_vectors(store, dimension, factory)
    faiss.write_index(index.index, str(path))
    return index


def side_table_size(store) -> dict:
    """What ``doc_values`` and its indexes take on disk (SQLite's dbstat), against the whole store."""
    conn = store._conn()
    sizes = dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    side = sum(v for k, v in sizes.items() if k.startswith("doc_values"))
    return {
        "doc_values_mb": round(side / 2**20, 1),
        "store_mb": round(sum(sizes.values()) / 2**20, 1),
        "rows": conn.execute("SELECT COUNT(*) FROM doc_values").fetchone()[0],
    }


def write_cost(documents: int = 10_000, batch: int = 500, rounds: int = 2) -> dict:
    """Upsert throughput into a fresh store, documents of one chunk with a 384-d vector and this benchmark's
    metadata, with the ``doc_values`` side table kept and with its fill replaced by a no-op (A/B, alternated)."""
    import tempfile

    import index.store as store_module
    from index.chunking import Chunk
    from index.records import Document

    fill = store_module.FILL_VALUES
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((batch, 384)).astype(np.float32)
    rates: dict[str, list[float]] = {"with_side_table": [], "without": []}
    for _ in range(rounds):
        for arm in rates:
            store_module.FILL_VALUES = (
                fill if arm == "with_side_table" else "SELECT 1 FROM documents d WHERE "
            )
            with tempfile.TemporaryDirectory() as folder:
                store = store_module.DocumentStore(Path(folder) / "store.sqlite")
                started = time.perf_counter()
                for start in range(0, documents, batch):
                    items = []
                    for i in range(start, start + batch):
                        meta = {
                            "bucket": i % 1000,
                            "date": f"2021-{1 + i % 12:02d}-{1 + i % 28:02d}",
                            "source": i % 7,
                        }
                        text = f"passage {i} of the write benchmark"
                        items.append(
                            (
                                Document(f"w{i}", text, meta),
                                [Chunk(0, text, 8)],
                                vectors[i - start : i - start + 1],
                            )
                        )
                    with store.transaction() as conn:
                        store.write_documents(conn, items, log=True)
                rates[arm].append(documents / (time.perf_counter() - started))
                store.close()
    store_module.FILL_VALUES = fill
    best = {arm: round(max(values), 1) for arm, values in rates.items()}
    return {
        "documents": documents,
        "batch": batch,
        "docs_per_second": best,
        "all_rounds": {arm: [round(v, 1) for v in values] for arm, values in rates.items()},
        "slowdown": round(best["without"] / best["with_side_table"], 3),
    }


def run_config(index, vectors, texts, mode: str, filters) -> tuple[list[float], list[list[str]]]:
    times, results = [], []
    for vector, text in zip(vectors, texts, strict=True):
        started = time.perf_counter()
        hits = index.search(vector, text, top_k=10, mode=mode, filters=filters)
        times.append(1000 * (time.perf_counter() - started))
        results.append([h.id for h in hits])
    return times, results


def percentiles(times: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(times, 50)), 2),
        "p99_ms": round(float(np.percentile(times, 99)), 2),
    }


def recall(found: list[list[str]], truth: list[list[str]]) -> float:
    hits = sum(len(set(f) & set(t)) for f, t in zip(found, truth, strict=True))
    return round(hits / max(1, sum(len(t) for t in truth)), 4)


def measure(args, encoder) -> list[dict]:
    from index.search_index import SearchIndex

    queries, _ = split_sentences(random.Random(0))
    texts = queries[: args.queries]
    vectors = encoder.embed(texts, normalize=True)
    started = time.perf_counter()  # the first open of a store built without ``doc_values`` fills it
    index = SearchIndex.open(args.index_dir / "index", encoder, create=False)
    open_seconds = time.perf_counter() - started
    index.wait_for_lexical()
    live = index._live  # the benchmark swaps FAISS indexes of the same vectors onto the opened version
    store, dimension = live.store, live.vectors.dimension
    counts = {name: len(store.filtered_chunk_ids(f)) for name, f in FILTERS.items()}
    total = store.counts()["chunks"]
    print("matching chunks:", {k: f"{v} ({v / total:.2%})" for k, v in counts.items()}, flush=True)

    live.vectors = vectors_for(args, store, dimension, EXACT)
    truth = {
        (mode, name): run_config(index, vectors, texts, mode, FILTERS[name])[1]
        for mode in ("dense", "hybrid")
        for name in FILTERS
    }
    rows = []
    conditions = {"none": None, **FILTERS}
    for factory in args.factories.split(";"):
        live.vectors = vectors_for(args, store, dimension, factory)
        for mode in MODES:
            run_config(index, vectors[:5], texts[:5], mode, None)  # warm caches once per mode
            # Query by query, unfiltered and each filter in turn: load from the shared machine falls on all alike.
            times: dict[str, list[float]] = {name: [] for name in conditions}
            found: dict[str, list[list[str]]] = {name: [] for name in conditions}
            for i in range(len(texts)):
                for name, filters in conditions.items():
                    took, hits = run_config(index, vectors[i : i + 1], texts[i : i + 1], mode, filters)
                    times[name] += took
                    found[name] += hits
            base = percentiles(times["none"])
            for name in FILTERS:
                row = {
                    "chunks": total,
                    "factory": factory,
                    "params": live.vectors.params,
                    "selectivity": name,
                    "matching_chunks": counts[name],
                    "mode": mode,
                    "filtered": percentiles(times[name]),
                    "unfiltered": base,
                }
                row["p50_ratio"] = round(row["filtered"]["p50_ms"] / base["p50_ms"], 2)
                row["p99_ratio"] = round(row["filtered"]["p99_ms"] / base["p99_ms"], 2)
                if mode != "bm25":
                    row["recall@10"] = recall(found[name], truth[mode, name])
                rows.append(row)
                print(
                    f"{factory:16} {name:5} {mode:7} filtered {row['filtered']['p50_ms']:8.2f} /"
                    f" {row['filtered']['p99_ms']:8.2f}  unfiltered {base['p50_ms']:7.2f} / {base['p99_ms']:7.2f}"
                    f"  ratio {row['p50_ratio']:5.2f} / {row['p99_ratio']:5.2f}  recall {row.get('recall@10', '-')}",
                    flush=True,
                )
    sizes = side_table_size(store) | {"open_seconds": round(open_seconds, 1)}
    index.close()
    return rows, sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--index-dir", type=Path, default=Path("/tmp/cloze-filtered-search"))
    parser.add_argument("--factories", default="IVF1024,Flat;IVF1024,PQ48x8", help="';'-separated")
    parser.add_argument("--queries", type=int, default=200, help="held-out queries timed per configuration")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--skip-write-cost", action="store_true")
    parser.add_argument(
        "--before",
        type=Path,
        help="an earlier run's result file (e.g. of the code before a change), kept beside",
    )
    parser.add_argument("--before-commit", default="", help="the commit --before was measured at")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "filtered_search.json"
    )
    args = parser.parse_args()

    from encoder_runtime import load_encoder

    encoder = load_encoder(backend=args.backend)
    info = build(args, encoder)
    if args.build_only:
        print(json.dumps(info))
        return
    rows, sizes = measure(args, encoder)
    writes = write_cost() if not args.skip_write_cost else None
    result = {
        "command": command(),
        "backend": args.backend,
        "queries": args.queries,
        "top_k": 10,
        "filters": FILTERS,
        "build": info,
        "rows": rows,
        "side_table": sizes,
        "write_cost": writes,
        "cpu_count": os.cpu_count(),
    }
    if args.before:
        before = json.loads(args.before.read_text())
        result["before"] = {
            "commit": args.before_commit,
            "command": before["command"],
            "queries": before["queries"],
            "rows": [
                {
                    key: row[key]
                    for key in ("factory", "selectivity", "mode", "filtered", "unfiltered", "p50_ratio")
                }
                for row in before["rows"]
            ],
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
