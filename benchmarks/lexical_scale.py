"""BM25 before and after tantivy, side by side in one process: the in-memory index a checkout of the old tree
holds (``--before``: its ``index/storage/lexical.py``) against this tree's tantivy index, on one store of real
prose (benchmarks/index_scale.py's sentences, re-combined into chunks of ``--words`` words) and 100 held-out
sentences as queries. CPU seconds are the fair figure on a shared machine (wall seconds beside them).

Measured for each: the build (the old one runs at every open), opening a built index, bytes per chunk (on disk
for tantivy; the old one's postings arrays in memory), query p50/p99 unfiltered and with a filter mask matching
10% and 1% of the chunks (for tantivy also each way a mask applies, forced: a deeper top list whose matches
are kept, ``widen``, or the query restricted to the mask's rows, ``restrict``), one upsert's catch-up (the
write path's share) and, for tantivy, the commit of the held writes, and the top 10's agreement.

    nice -n 10 .venv/bin/python benchmarks/lexical_scale.py --chunks 100000 --before /tmp/before-checkout
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.index_scale import split_sentences  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from index.records import Document  # noqa: E402
from index.storage import lexical  # noqa: E402
from index.storage.lexical import LexicalIndex  # noqa: E402
from index.storage.store import DocumentStore  # noqa: E402
from index.text.chunking import Chunk  # noqa: E402

QUERIES = 100


def corpus(chunks: int, words: tuple[int, int], seed: int = 0) -> tuple[list[str], list[str]]:
    """(chunk texts of ``words`` words of consecutive pool sentences, held-out query sentences)."""
    rng = random.Random(seed)
    queries, pool = split_sentences(rng)
    texts = []
    for _ in range(chunks):
        start, target, text = rng.randrange(len(pool) - 50), rng.randint(*words), []
        while len(text) < target:
            text += pool[start].split()
            start += 1
        texts.append(" ".join(text[:target]))
    return texts, queries[:QUERIES]


def fill(store: DocumentStore, texts: list[str]) -> None:
    for first in range(0, len(texts), 5000):
        items = [
            (Document(f"c{i}", text, {}), [Chunk(0, text, 0)], None)
            for i, text in enumerate(texts[first : first + 5000], first)
        ]
        with store.transaction() as conn:
            store.write_documents(conn, items, log=True)


def timed(run) -> tuple[float, float, object]:
    """(CPU seconds, wall seconds, result) of ``run()``."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = run()
    return time.process_time() - cpu, time.perf_counter() - wall, result


def latencies(search, queries: list[str]) -> dict[str, float]:
    cpu = []
    for query in queries:
        started = time.process_time()
        search(query)
        cpu.append(time.process_time() - started)
    return {"p50_ms": 1000 * float(np.percentile(cpu, 50)), "p99_ms": 1000 * float(np.percentile(cpu, 99))}


def load_before(checkout: Path):
    """The old tree's ``index.storage.lexical`` module (it imports the store and analysis, unchanged)."""
    spec = importlib.util.spec_from_file_location("lexical_before", checkout / "index/storage/lexical.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lexical_before"] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def measure(name: str, index, build, reopen, store: DocumentStore, queries: list[str], masks) -> dict:
    result: dict = {}
    cpu, wall, _ = timed(build)
    result["build_cpu_s"], result["build_wall_s"] = round(cpu, 2), round(wall, 2)
    cpu, wall, index = timed(lambda: reopen(index))
    result["open_cpu_s"], result["open_wall_s"] = round(cpu, 3), round(wall, 3)
    result["bytes_per_chunk"] = round(index_bytes(index) / store.counts()["documents"], 1)
    result["unfiltered"] = latencies(lambda q: index.search(q, 10), queries)
    for label, mask in masks.items():
        result[f"filter_{label}"] = latencies(lambda q, m=mask: index.search(q, 10, rows=m), queries)
    if isinstance(index, LexicalIndex):  # the two ways a mask applies, each forced
        for plan in ("widen", "restrict"):
            for label, mask in masks.items():
                with forced(plan == "widen"):
                    result[f"filter_{label}_{plan}"] = latencies(
                        lambda q, m=mask: index.search(q, 10, rows=m), queries
                    )
    result["upsert_catch_up"] = upsert_cost(index, store)
    if isinstance(index, LexicalIndex):  # the held writes' commit, once per COMMIT_EVERY documents
        cpu, wall, _ = timed(index.save)
        result["commit_held_ms"] = {"cpu_ms": round(1000 * cpu, 2), "wall_ms": round(1000 * wall, 2)}
    print(name, json.dumps(result), flush=True)
    return result


@contextlib.contextmanager
def forced(widen: bool):
    """Every filter widens the top list (until it holds ``limit`` matches), or none does."""
    saved, lexical.widens = lexical.widens, lambda pool, matched: widen
    try:
        yield
    finally:
        lexical.widens = saved


def index_bytes(index) -> int:
    if hasattr(index, "disk_bytes"):
        return index.disk_bytes()
    postings = sum(a.itemsize * len(a) for pair in index._postings.values() for a in pair)
    return postings + sum(a.itemsize * len(a) for a in (index._rows, index._lengths, index._alive))


def upsert_cost(index, store: DocumentStore, rounds: int = 30) -> dict[str, float]:
    """One document upserted and synced (the catch-up a write waits for): median CPU and wall ms."""
    walls, cpus = [], []
    for i in range(rounds):
        text = f"zebrafish xylophone number {i} quantified in a fresh document"
        with store.transaction() as conn:
            store.write_documents(
                conn, [(Document(f"new{i % 3}", text, {}), [Chunk(0, text, 0)], None)], log=True
            )
        cpu, wall, _ = timed(lambda: index.sync(store))
        cpus.append(cpu)
        walls.append(wall)
    return {
        "cpu_ms": round(1000 * float(np.median(cpus)), 2),
        "wall_ms": round(1000 * float(np.median(walls)), 2),
    }


def top10_agreement(before, after, queries: list[str]) -> float:
    shared = [
        len({d for d, _ in before.search(q, 10)} & {d for d, _ in after.search(q, 10)}) for q in queries
    ]
    return round(sum(shared) / (10 * len(queries)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--words", default="100-200", help="chunk length in words, min-max")
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the tree before tantivy")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/lexical_scale.json")
    args = parser.parse_args()
    low, high = (int(x) for x in args.words.split("-"))
    work = Path(tempfile.mkdtemp(prefix="lexical-scale-"))
    try:
        texts, queries = corpus(args.chunks, (low, high))
        store = DocumentStore(work / "store.sqlite")
        fill(store, texts)
        rng = np.random.default_rng(0)
        size = store.counts()["documents"] + 1
        masks = {"10pct": rng.random(size) < 0.10, "1pct": rng.random(size) < 0.01}
        old = load_before(args.before).LexicalIndex()
        before = measure(
            "before", old, lambda: old.build(store), rebuild(store, args.before), store, queries, masks
        )
        new = LexicalIndex(work / "lexical")
        after = measure(
            "after", new, lambda: new.build(store), reopen_tantivy(store, work), store, queries, masks
        )
        new = LexicalIndex(work / "lexical")
        new.start(store)
        result = {
            "command": command(),
            "load_average": load_average(),
            "chunks": args.chunks,
            "words_per_chunk": args.words,
            "queries": len(queries),
            "before": before,
            "after": after,
            "top10_agreement": top10_agreement(old, new, queries),
            "note": "CPU seconds per query and per build; before = the in-memory index of --before (built at every "
            "open, so its open is a build); after = tantivy on disk. bytes_per_chunk: before its postings arrays in "
            "memory, after tantivy's folder on disk. upsert_catch_up: one document's sync (median CPU and wall ms).",
        }
        new.stop()
        store.close()
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rebuild(store: DocumentStore, checkout: Path):
    def reopen(_index):
        fresh = load_before(checkout).LexicalIndex()
        fresh.build(store)
        return fresh

    return reopen


def reopen_tantivy(store: DocumentStore, work: Path):
    def reopen(index):
        index.save()
        index.stop()
        fresh = LexicalIndex(work / "lexical")
        assert fresh.start(store) is None and fresh.ready  # no build: opened from disk
        return fresh

    return reopen


if __name__ == "__main__":
    main()
