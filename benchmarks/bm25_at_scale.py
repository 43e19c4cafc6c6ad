"""BM25 on tantivy as one host's collection grows to 10M chunks (issue 68): how fast a query answers, unfiltered
and with 10% and 1% filters, what the index holds on disk and in memory, and how long it takes to open.

One tantivy index, written with the product's schema and terms (``index.storage.lexical``: Snowball stems,
stopwords as one placeholder term) from host_scale's corpus (100-200 words of real prose a chunk, streamed, never
written out: ``host_scale.prose_corpus``), grows through ``--checkpoints``; at each, a fresh process opens it as
the service does (``LexicalIndex``) and times ``--queries`` held-out sentences as BM25 queries, top 10, CPU and
wall each. Filters are masks over the rows (``bucket < 100``, ``bucket < 10``), as the columns hand them over.

Only tantivy is measured: the store, FAISS and the columns are host_scale's (measured there at 1M), and the
index before tantivy cannot hold 10M here (issue 68 projects its 9.2 GB of RAM and 42-minute build). The pool
has about 40,000 sentences: a real 10M corpus has more distinct terms, but its common words are as common, and
they set a query's cost. The build uses two indexing threads and a larger heap than the
service's writer (a bulk load; the segments are merged by tantivy's default policy either way).

    nice -n 10 .venv/bin/python benchmarks/bm25_at_scale.py --checkpoints 1000000 3000000 10000000 --work WORK
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.host_scale import FILTERS, GOALS, memory_mb, percentiles, prose_corpus  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402

BUILD_HEAP = 512 << 20
BUILD_THREADS = 2
KEYWORDS = "none, 3 words"  # the sentences cut to three query words, unfiltered: latency grows with terms


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def keywords(sentence: str) -> str:
    """A keyword query from a held-out sentence: its first three words that are query terms."""
    from index.storage.lexical import query_stems

    return " ".join([word for word in sentence.split() if query_stems(word)][:3])


def masks(buckets: np.ndarray) -> dict[str, np.ndarray | None]:
    """Each of host_scale's filters as the columns hand it to BM25: a mask over the rows."""
    limits = {name: None if tree is None else tree["bucket"]["$lt"] for name, tree in FILTERS.items()}
    return {name: None if limit is None else buckets < limit for name, limit in limits.items()}


def grow(folder: Path, checkpoints: list[int], queries: int) -> list[dict]:
    """Index the corpus through every checkpoint; measure each in a fresh process."""
    import tantivy

    from index.storage import lexical

    held_out, documents = prose_corpus(checkpoints[-1], queries)
    folder.parent.mkdir(parents=True, exist_ok=True)
    (folder.parent / "queries.json").write_text(json.dumps(held_out))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    index = tantivy.Index(lexical.SCHEMA, path=str(folder))
    buckets = np.zeros(checkpoints[-1], np.int16)
    results, done, build_cpu, build_wall = [], 0, 0.0, 0.0
    for checkpoint in checkpoints:
        started, used = time.perf_counter(), cpu_s()
        writer = index.writer(BUILD_HEAP, BUILD_THREADS)
        for rid in range(done, checkpoint):
            document = next(documents)
            buckets[rid] = document["bucket"]
            writer.add_document(
                lexical._document(document["id"], rid, lexical.indexed_terms(document["text"]))
            )
        writer.commit()
        writer.wait_merging_threads()
        build_cpu += cpu_s() - used  # this process's: the indexing threads count
        build_wall += time.perf_counter() - started
        done = checkpoint
        (folder / lexical.SYNCED).write_text(json.dumps({"synced_seq": 0, "format": lexical.FORMAT}))
        np.save(folder.parent / "buckets.npy", buckets[:done])
        measured = measure_in_fresh_process(folder)
        results.append(
            {"chunks": done, "build_cpu_s": round(build_cpu, 1), "build_wall_s": round(build_wall, 1)}
        )
        results[-1] |= measured
        print(json.dumps(results[-1]), flush=True)
    return results


def measure_in_fresh_process(folder: Path) -> dict:
    found = subprocess.run(
        [sys.executable, __file__, "--measure", str(folder)], capture_output=True, text=True, check=True
    )
    return json.loads(found.stdout.splitlines()[-1])


def measure(folder: Path) -> dict:
    """Open as the service does, then every query under every filter, interleaved query by query."""
    from index.storage.lexical import LexicalIndex

    before = memory_mb()["VmRSS"]
    started = time.perf_counter()
    lexical = LexicalIndex(folder)
    opened_s, opened_mb = time.perf_counter() - started, memory_mb()["VmRSS"]
    buckets = np.load(folder.parent / "buckets.npy")
    if lexical.documents != len(buckets):  # not opened (no sidecar, another format): nothing would be timed
        raise SystemExit(f"{folder}: {lexical.documents} documents open, {len(buckets)} written")
    texts = json.loads((folder.parent / "queries.json").read_text())
    runs = [(name, mask, False) for name, mask in masks(buckets).items()] + [(KEYWORDS, None, True)]
    wall: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for text in texts[:3]:  # warm the page cache's first touch of each structure
        for _, mask, _ in runs:
            lexical.search(text, 10, rows=mask)
    for text in texts:
        for name, mask, short in runs:
            query = keywords(text) if short else text
            started, used = time.perf_counter(), cpu_s()
            lexical.search(query, 10, rows=mask)
            wall[name].append(1000 * (time.perf_counter() - started))
            cpu[name].append(1000 * (cpu_s() - used))
    disk = sum(path.stat().st_size for path in folder.iterdir() if path.is_file())
    out = {
        "open_s": round(opened_s, 3),
        "rss_opened_mb": round(opened_mb - before, 1),
        "rss_after_queries_mb": round(memory_mb()["VmRSS"] - before, 1),
        "disk_mb": round(disk / 2**20, 1),
        "disk_bytes_per_chunk": round(disk / len(buckets), 1),
        "segments": lexical._view.searcher.num_segments,
        "queries": len(texts),
    }
    out |= {name: {"wall": percentiles(wall[name]), "cpu": percentiles(cpu[name])} for name in wall}
    lexical.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bm25-at-scale")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bm25_at_scale.json")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the fresh process's job
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    if sorted(args.checkpoints) != args.checkpoints:
        parser.error("--checkpoints must grow")
    result = {"command": command(), "load_average_start": load_average()}
    result["checkpoints"] = grow(args.work / "lexical", args.checkpoints, args.queries)
    result |= {"load_average_end": load_average(), "goal_bm25_p50_ms": GOALS["bm25_p50_ms"]}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
