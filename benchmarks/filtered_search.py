"""Filtered search at scale: latency of filtered against unfiltered search and recall@10 against exact search with
the same filter, before (the code of another git revision, by default the last one before the filtered-search
work of issue 67) and after (this tree), timed on the same index folder and queries in one run.

Two corpora:

- ``real``: the ``index_scale`` corpus (real prose passages, ``benchmarks/index_scale.py``) embedded by the bundled
  model, each document given synthetic metadata at build time so selectivities are exact: ``bucket``, an integer
  0..999 (a seeded permutation of ``i % 1000``) and ``date``, 2020-01-01 + (another permutation) days. Dense, BM25
  and hybrid.
- ``synthetic``: N documents of one chunk each whose vectors are SYNTHETIC unit vectors at the model's dimension
  (384): a mixture of 1,000 Gaussian clusters, normalised (uniform random vectors would make every ANN index look
  worse than on real embeddings; FAISS's cost does not depend on where vectors come from). Queries are drawn the
  same way. Metadata: ``tenant`` (1,000 values), ``year`` (2000..2009), ``published`` (an ISO date over those ten
  years), ``kind`` (10 values) and ``tags`` (2 of 20). Dense only (BM25's mask is measured on the real corpus).

Filters of 0.1%, 1%, 10%, 50% and 90%, each alone and combined with ``$or`` / ``$not``. Each side runs in its own
process (a worker: this file with ``PYTHONPATH`` on that side's tree) that opens the index read-only; the FAISS
index of each factory is built once from the stored vectors and cached beside the index, and both sides swap the
same file in. Per factory and mode, query by query, the two sides take turns (which goes first alternates), each
timing ``SearchIndex.search`` unfiltered and with every filter: wall time (p50 / p99) and the CPU time of the
searching thread (the machine is shared: CPU time is what other work does not inflate). Recall@10 of the returned
documents against an exact ``IDMap2,Flat`` search with the same filter (this tree). Also: the columns' memory and
load time, the write slowdown they cost, and where exact scoring of the matches stops beating one bitmap search.

    nice -n 10 .venv/bin/python benchmarks/filtered_search.py real --passages 100000 --index-dir runs/fs-real \
        --out benchmarks/results/filtered_search.json
    nice -n 10 .venv/bin/python benchmarks/filtered_search.py synthetic --documents 1000000 --index-dir runs/fs-1m \
        --out benchmarks/results/filtered_search_synthetic.json
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CODE_ENV = "CLOZE_FILTERED_CODE"  # a worker's tree: whose index/ it imports
sys.path.insert(0, str(ROOT))
if os.environ.get(CODE_ENV):
    sys.path.insert(0, os.environ[CODE_ENV])

from benchmarks.index_scale import split_sentences, write_corpus  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BASELINE = "044c3b7"  # main before issue 67's filter work: 1 / rate widening, SQLite's plans kept beside
REAL_FILTERS = {
    "0.1%": {"bucket": 7},
    "0.1% $or/$not": {"$or": [{"bucket": 7}, {"bucket": 8}], "$not": {"date": {"$lt": "2021-05-15"}}},
    "1%": {"bucket": {"$lt": 10}},
    "1% $or/$not": {"$or": [{"bucket": {"$lt": 5}}, {"bucket": {"$gte": 995}}]},
    "10%": {"bucket": {"$lt": 100}},
    "10% $or/$not": {"$not": {"bucket": {"$gte": 100}}},
    "50%": {"date": {"$gte": "2021-05-15"}},
    "50% $or/$not": {"$or": [{"bucket": {"$lt": 250}}, {"bucket": {"$gte": 750}}]},
    "90%": {"date": {"$gte": "2020-04-10"}},
    "90% $or/$not": {"$not": {"bucket": {"$lt": 100}}},
}
KINDS = [f"k{i}" for i in range(10)]
SYNTHETIC_FILTERS = {
    "0.1%": {"tenant": "t7"},
    "0.1% $or/$not": {"$or": [{"tenant": "t7"}, {"tenant": "t8"}], "$not": {"kind": {"$in": KINDS[:5]}}},
    "1%": {"tenant": {"$in": [f"t{i}" for i in range(10)]}},
    "1% $or/$not": {"kind": "k3", "$not": {"year": {"$lt": 2009}}},
    "10%": {"kind": "k3"},
    "10% $or/$not": {"$or": [{"tags": "g3", "year": {"$lt": 2005}}, {"kind": "k4", "year": {"$gte": 2005}}]},
    "50%": {"published": {"$gte": "2005-01-01"}},
    "50% $or/$not": {"$not": {"kind": {"$in": KINDS[:5]}}},
    "90%": {"year": {"$ne": 2003}},
    "90% $or/$not": {"$or": [{"kind": {"$nin": ["k0"]}}, {"tenant": "t1", "kind": "k0"}]},
}
EXACT = "IDMap2,Flat"
SIDES = ("before", "after")


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


def build_real(args, encoder) -> dict:
    """The real-text index under ``--index-dir`` (built once; reused when it is there)."""
    from index.build.builder import BuildOptions, build_from_input
    from index.storage import layout

    root = args.index_dir / "index"
    if layout.current_version(root) is not None:
        return json.loads((args.index_dir / "build.json").read_text())
    args.index_dir.mkdir(parents=True, exist_ok=True)
    plain, corpus = args.index_dir / "plain.jsonl.gz", args.index_dir / "corpus.jsonl.gz"
    write_corpus(plain, args.passages, (1, 2))
    with_metadata(plain, corpus)
    started = time.perf_counter()
    options = BuildOptions(factory="IVF1024,Flat", show_progress=False)
    manifest = build_from_input(root, corpus, encoder, options)
    info = {
        "documents": args.passages,
        "chunks": manifest["chunks"],
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (args.index_dir / "build.json").write_text(json.dumps(info))
    return info


def synthetic_vectors(rng: np.random.Generator, centers: np.ndarray, count: int) -> np.ndarray:
    picked = centers[rng.integers(0, len(centers), count)]
    vectors = picked + rng.standard_normal(picked.shape).astype(np.float32) * 0.05
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def synthetic_metadata(i: int, rng: random.Random) -> dict:
    day = rng.randrange(3652)
    return {
        "tenant": f"t{rng.randrange(1000)}",
        "year": 2000 + day * 10 // 3652,
        "published": str(np.datetime64("2000-01-01") + np.timedelta64(day, "D")),
        "kind": KINDS[rng.randrange(10)],
        "tags": rng.sample([f"g{t}" for t in range(20)], 2),
    }


def build_synthetic(args, encoder) -> dict:
    """N one-chunk documents written straight into a fresh index's store (nothing embedded, each batch of 10,000
    seeded by its first number), then the exact FAISS index of the stored vectors saved as the version's own."""
    import faiss

    from index.records import Document
    from index.search_index import SearchIndex
    from index.storage import layout
    from index.storage.store import DocumentStore
    from index.storage.vectors import build_vectors
    from index.text.chunking import Chunk

    root = args.index_dir / "index"
    marker = args.index_dir / "build.json"
    if marker.exists():
        return json.loads(marker.read_text())
    args.index_dir.mkdir(parents=True, exist_ok=True)
    if layout.current_version(root) is None:
        SearchIndex.open(root, encoder).close()
    # The store alone (an interrupted write continues where it stopped; ``--documents`` at or below what is
    # written ends the writing there): opening the index now would rebuild FAISS from a partial store.
    store = DocumentStore(layout.version_dir(root, layout.current_version(root)) / layout.STORE)
    rng, meta_rng = np.random.default_rng(0), random.Random(0)
    centers = rng.standard_normal((1000, 384)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    np.save(args.index_dir / "centers.npy", centers)
    started = time.perf_counter()
    for start in range(store.counts()["documents"], args.documents, 10_000):
        rng, meta_rng = np.random.default_rng(start), random.Random(start)
        count = min(10_000, args.documents - start)
        vectors = synthetic_vectors(rng, centers, count)
        items = [
            (
                Document(f"s{i}", f"s{i}", synthetic_metadata(i, meta_rng)),
                [Chunk(0, f"s{i}", 1)],
                vectors[j : j + 1],
            )
            for j, i in enumerate(range(start, start + count))
        ]
        with store.transaction() as conn:
            store.write_documents(conn, items, log=False)
        print(f"written {start + count}", flush=True)
    exact = build_vectors(store, 384, EXACT)  # the version's own snapshot: the next open has nothing to redo
    exact.save(store.path.parent / layout.VECTORS, {"synced_seq": store.max_seq()})
    faiss.write_index(exact.index, str(args.index_dir / f"vectors-{EXACT.replace(',', '_')}.faiss"))
    written = store.counts()["documents"]
    store.close()
    info = {
        "documents": written,
        "chunks": written,
        "write_seconds": round(time.perf_counter() - started, 1),
    }
    marker.write_text(json.dumps(info))
    return info


def vectors_for(index_dir: Path, live, factory: str):
    """The FAISS index of ``factory`` over the stored vectors, cached beside the index (built by the "after"
    worker, which is asked first)."""
    import faiss

    from index.storage.vectors import VectorIndex, build_vectors, default_params

    path = index_dir / f"vectors-{factory.replace(',', '_')}.faiss"
    if path.exists():
        index = faiss.read_index(str(path))
    else:
        started = time.perf_counter()
        index = build_vectors(live.store, live.vectors.dimension, factory).index
        faiss.write_index(index, str(path))
        print(f"built {factory} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return VectorIndex(index, factory, default_params(factory))


def timed(index, vector, text, mode, filters) -> tuple[float, float, list[str]]:
    """Wall and searching-thread CPU milliseconds of one search, and the ids it returned."""
    wall, cpu = time.perf_counter(), time.thread_time()
    hits = index.search(vector, text, top_k=10, mode=mode, filters=filters)
    return 1000 * (time.perf_counter() - wall), 1000 * (time.thread_time() - cpu), [h.id for h in hits]


# ---- the worker: one side's code, answering the driver's requests (a JSON line each) ----------------------


class Worker:
    """The index opened read-only with this process's code; requests name a factory, a mode, a query."""

    def __init__(self, index_dir: Path, queries: Path, backend: str):
        import faiss

        from encoder_runtime import load_encoder
        from index.search_index import SearchIndex

        faiss.omp_set_num_threads(1)  # as the service runs it: one query a request, concurrency from requests
        self.index_dir = index_dir
        saved = np.load(queries, allow_pickle=False)
        self.vectors, self.texts = saved["vectors"], [str(t) for t in saved["texts"]]
        started = time.perf_counter()
        self.index = SearchIndex.open(
            index_dir / "index", load_encoder(backend=backend), create=False, read_only=True
        )
        self.index.wait_for_lexical()
        self.open_seconds = round(time.perf_counter() - started, 1)

    def use(self, factory: str) -> dict:
        self.index._live.vectors = vectors_for(self.index_dir, self.index._live, factory)
        return {"params": self.index._live.vectors.params}

    def run(self, mode: str, query: int, filters: list) -> list:
        """Unfiltered, then each filter, for one query: [wall ms, CPU ms, ids] each."""
        vector, text = self.vectors[query], self.texts[query]
        return [timed(self.index, vector, text, mode, f or None) for f in [None, *filters]]

    def matching(self, filters: list) -> dict:
        total = self.index.count_documents()
        return {"documents": total, "matching": [self.index.count_documents(f) / total for f in filters]}

    def crossover(self, filters: dict, queries: int) -> list[dict]:
        """Where scoring a filter's matches exactly (read back from FAISS) stops beating one bitmap search, on an
        index that can read vectors back."""
        import index.query.ranking as ranking
        from index.storage.filters import parse_filter

        saved, out = ranking.SELECTIVE_CHUNKS, []
        for name, f in filters.items():
            row = {"filter": name, "matching_chunks": self.index._live.select(parse_filter(f)).chunk_count}
            for label, limit in (("exact_ms", 10**12), ("bitmap_ms", 0)):
                ranking.SELECTIVE_CHUNKS = limit
                times = [timed(self.index, v, "", "dense", f)[0] for v in self.vectors[:queries]]
                row[label] = round(float(np.percentile(times, 50)), 3)
            out.append(row)
        ranking.SELECTIVE_CHUNKS = saved
        return out

    def columns(self) -> dict:
        return columns_memory(self.index)


def serve(args) -> None:
    """Answer requests on stdin; anything else printed (FAISS, logging) goes to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    worker = Worker(args.index_dir, args.queries_file, args.backend)
    replies.write(json.dumps({"open_seconds": worker.open_seconds}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        answer = getattr(worker, request.pop("op"))(**request)
        replies.write(json.dumps(answer) + "\n")
        replies.flush()


class Side:
    """A worker process running ``code``'s tree."""

    def __init__(self, name: str, code: Path, args, queries: Path):
        self.name = name
        env = os.environ | {CODE_ENV: str(code), "PYTHONPATH": str(code)}
        worker = [sys.executable, str(Path(__file__).resolve()), "worker", "--index-dir", str(args.index_dir)]
        worker += ["--queries-file", str(queries), "--backend", args.backend, "--out", os.devnull]
        self.process = subprocess.Popen(
            worker, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        self.opened = self._reply()

    def ask(self, op: str, **request):
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **request}) + "\n")
        self.process.stdin.flush()
        return self._reply()

    def _reply(self):
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker stopped (exit {self.process.wait()}); see its stderr")
        return json.loads(line)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def checkout(revision: str, folder: Path) -> Path:
    """``revision``'s tree (``git archive``), for the "before" worker to import."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def columns_memory(index) -> dict:
    """The columns of the live version loaded once more: bytes held (arrays) and RSS growth, per document."""
    import gc

    from index.storage.columns import Columns

    live = index._live
    documents = live.store.counts()["documents"]
    gc.collect()
    before, started = rss_bytes(), time.perf_counter()
    columns = Columns.load(live.store)
    seconds, grown = time.perf_counter() - started, rss_bytes() - before
    fields = len(columns.fields)
    return {
        "documents": documents,
        "fields": fields,
        "load_seconds": round(seconds, 2),
        "array_bytes": columns.nbytes(),
        "rss_growth_bytes": grown,
        "bytes_per_document": round(columns.nbytes() / documents, 1),
        "bytes_per_document_per_field": round(columns.nbytes() / documents / max(fields, 1), 1),
        "strings": len(columns.texts),
    }


def write_cost(encoder, documents: int, batch: int, rounds: int = 2) -> dict:
    """Store-only writes (vectors given, nothing embedded) into a fresh index: ``SearchIndex.commit`` of batches of
    ``batch`` documents with this benchmark's synthetic metadata, with the columns kept and with their upkeep
    replaced by a no-op (A/B, alternated)."""
    from index.records import Document
    from index.search_index import SearchIndex
    from index.storage.changelog import Columns
    from index.text.chunking import Chunk

    read, apply = Columns.read_changes, Columns.apply
    rng, meta_rng = np.random.default_rng(0), random.Random(0)
    vectors = rng.standard_normal((documents, 384)).astype(np.float32)
    rates: dict[str, list[float]] = {"with_columns": [], "without": []}
    for _ in range(rounds):
        for arm in rates:
            if arm == "without":
                Columns.read_changes = staticmethod(lambda store, changes: None)
                Columns.apply = lambda self, update: None
            with tempfile.TemporaryDirectory() as folder:
                index = SearchIndex.open(Path(folder) / "idx", encoder)
                started = time.perf_counter()
                for start in range(0, documents, batch):
                    items = [
                        (
                            Document(f"w{i}", f"w{i}", synthetic_metadata(i, meta_rng)),
                            [Chunk(0, f"w{i}", 1)],
                            vectors[i : i + 1],
                        )
                        for i in range(start, min(documents, start + batch))
                    ]
                    index.commit(items)
                rates[arm].append(documents / (time.perf_counter() - started))
                index.close()
            Columns.read_changes, Columns.apply = staticmethod(read), apply
    best = {arm: round(max(values), 1) for arm, values in rates.items()}
    return {
        "documents": documents,
        "batch": batch,
        "docs_per_second": best,
        "all_rounds": {arm: [round(v, 1) for v in values] for arm, values in rates.items()},
        "slowdown": round(best["without"] / best["with_columns"], 3),
    }


# ---- the driver ------------------------------------------------------------------------------------------


def percentiles(times: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(times, 50)), 3),
        "p99_ms": round(float(np.percentile(times, 99)), 3),
    }


def recall(found: list[list[str]], truth: list[list[str]]) -> float:
    hits = sum(len(set(f) & set(t)) for f, t in zip(found, truth, strict=True))
    return round(hits / max(1, sum(len(t) for t in truth)), 4)


def measured(sides: dict[str, Side], mode: str, filters: dict, queries: int) -> dict:
    """Per side: [query][0 unfiltered, 1.. each filter] = (wall, cpu, ids); the sides take turns per query."""
    names = list(filters.values())
    out: dict[str, list] = {side: [] for side in sides}
    for side in sides.values():  # warm caches
        for i in range(3):
            side.ask("run", mode=mode, query=i, filters=names)
    for i in range(queries):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            out[side].append(sides[side].ask("run", mode=mode, query=i, filters=names))
    return out


def rows_for(factory, params, mode, side, runs, filters, matching, truth) -> list[dict]:
    rows = []
    base = percentiles([r[0][0] for r in runs])
    base_cpu = percentiles([r[0][1] for r in runs])
    for j, name in enumerate(filters, start=1):
        row = {
            "factory": factory,
            "params": params,
            "mode": mode,
            "plan": side,
            "filter": name,
            "matching": round(matching[name], 5),
            "queries": len(runs),
            "filtered": percentiles([r[j][0] for r in runs]),
            "unfiltered": base,
            "filtered_cpu": percentiles([r[j][1] for r in runs]),
            "unfiltered_cpu": base_cpu,
        }
        row["p50_ratio"] = round(row["filtered"]["p50_ms"] / base["p50_ms"], 2)
        row["p99_ratio"] = round(row["filtered"]["p99_ms"] / base["p99_ms"], 2)
        row["cpu_p50_ratio"] = round(row["filtered_cpu"]["p50_ms"] / base_cpu["p50_ms"], 2)
        row["cpu_p99_ratio"] = round(row["filtered_cpu"]["p99_ms"] / base_cpu["p99_ms"], 2)
        if mode != "bm25":
            row["recall@10"] = recall([r[j][2] for r in runs], truth[mode][j][: len(runs)])
        rows.append(row)
        print(
            f"{factory:15} {mode:6} {side:6} {name:14} {row['filtered']['p50_ms']:8.2f} /"
            f" {row['filtered']['p99_ms']:8.2f} vs {base['p50_ms']:7.2f} / {base['p99_ms']:7.2f}"
            f"  x{row['p50_ratio']:5.2f} / x{row['p99_ratio']:5.2f} (cpu x{row['cpu_p50_ratio']:5.2f} /"
            f" x{row['cpu_p99_ratio']:5.2f})  recall {row.get('recall@10', '-')}",
            flush=True,
        )
    return rows


def measure(args, sides: dict[str, Side], filters: dict, modes: tuple[str, ...], matching: dict) -> dict:
    """Every factory x mode, both sides; the truth (exact search, this tree) first, and each factory's unfiltered
    recall@10 at its settings per side: the bar its filtered recall is held to."""
    after, names = sides["after"], list(filters.values())
    after.ask("use", factory=EXACT)
    truth = {}
    for mode in modes:
        if mode != "bm25":
            runs = [after.ask("run", mode=mode, query=i, filters=names) for i in range(args.queries)]
            truth[mode] = [[r[j][2] for r in runs] for j in range(len(names) + 1)]
    rows, unfiltered = [], {side: {} for side in sides}
    for factory in args.factories.split(";"):
        params = after.ask("use", factory=factory)["params"]  # builds the cached FAISS file when missing
        for side in SIDES:
            if side != "after":
                sides[side].ask("use", factory=factory)
        for mode in modes:
            runs = measured(sides, mode, filters, args.queries)
            for side, side_runs in runs.items():
                rows += rows_for(factory, params, mode, side, side_runs, filters, matching, truth)
                if mode == "dense":
                    unfiltered[side][factory] = recall([r[0][2] for r in side_runs], truth["dense"][0])
    return {
        "rows": rows,
        "unfiltered_recall@10": unfiltered["after"],
        "unfiltered_recall_before": unfiltered["before"],
    }


def queries_for(args, encoder) -> tuple[np.ndarray, list[str]]:
    if args.corpus == "real":
        texts = split_sentences(random.Random(0))[0][: args.queries]
        return encoder.embed(texts, normalize=True), texts
    rng = np.random.default_rng(1)
    centers = np.load(args.index_dir / "centers.npy")
    return synthetic_vectors(rng, centers, args.queries), [""] * args.queries


def drive(args) -> None:
    from encoder_runtime import load_encoder

    encoder = load_encoder(backend=args.backend)
    info = build_real(args, encoder) if args.corpus == "real" else build_synthetic(args, encoder)
    if args.build_only:
        print(json.dumps(info))
        return
    filters = REAL_FILTERS if args.corpus == "real" else SYNTHETIC_FILTERS
    modes = ("dense", "bm25", "hybrid") if args.corpus == "real" else ("dense",)
    with tempfile.TemporaryDirectory(prefix="filtered-search-") as folder:
        vectors, texts = queries_for(args, encoder)
        queries = Path(folder) / "queries.npz"
        np.savez(queries, vectors=vectors, texts=np.array(texts))
        before = args.baseline_checkout or checkout(args.baseline, Path(folder) / "before")
        sides = {"after": Side("after", ROOT, args, queries)}
        sides["before"] = Side("before", Path(before).resolve(), args, queries)
        try:
            counted = sides["after"].ask("matching", filters=list(filters.values()))
            matching = dict(zip(filters, counted["matching"], strict=True))
            print("matching:", {k: f"{v:.3%}" for k, v in matching.items()}, flush=True)
            result = {
                "command": command(),
                "corpus": args.corpus,
                "synthetic_vectors": args.corpus == "synthetic",
                "backend": args.backend,
                "top_k": 10,
                "before": {"revision": args.baseline, "checkout": str(args.baseline_checkout or "")},
                "filters": filters,
                "build": info,
                "open_seconds": {side: s.opened["open_seconds"] for side, s in sides.items()},
                "columns": sides["after"].ask("columns"),
                "load_average_start": load_average(),
                **measure(args, sides, filters, modes, matching),
            }
            sides["after"].ask("use", factory=args.crossover_factory)
            result["crossover"] = [
                {"factory": args.crossover_factory, **row}
                for row in sides["after"].ask("crossover", filters=filters, queries=min(30, args.queries))
            ]
            result["load_average_end"] = load_average()
            result["cpu_count"] = os.cpu_count()
        finally:
            for side in sides.values():
                side.close()
    if not args.skip_write_cost:
        result["write_cost"] = {
            "batch_500": write_cost(encoder, 10_000, 500),
            "batch_1": write_cost(encoder, 1_000, 1),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("corpus", choices=["real", "synthetic", "worker"])
    parser.add_argument("--passages", type=int, default=100_000, help="real: passages")
    parser.add_argument("--documents", type=int, default=1_000_000, help="synthetic: documents")
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--index-dir", type=Path, required=True)
    parser.add_argument("--factories", default="IDMap2,Flat;IVF1024,Flat;IVF1024,PQ48x8;HNSW32,Flat")
    parser.add_argument("--crossover-factory", default="HNSW32,Flat", help="one that reads vectors back")
    parser.add_argument("--queries", type=int, default=100, help="queries timed per configuration and side")
    parser.add_argument("--baseline", default=BASELINE, help="the git revision timed as before")
    parser.add_argument("--baseline-checkout", type=Path, default=None, help="its tree, already checked out")
    parser.add_argument("--queries-file", type=Path, help="worker: the queries the driver saved")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--skip-write-cost", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.corpus == "worker":
        serve(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
