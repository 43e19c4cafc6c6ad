"""Restore by import against the copy it replaced, side by side in one run.

A restore now reads the archive's store row by row into a store of its own, each document checked as an upsert
checks it, and rebuilds FAISS from the imported vectors; before, it adopted the archive's ``store.sqlite`` and
``vectors.faiss`` as they were. This times ``SearchIndex.restore`` of one archive with this checkout's code and
with the baseline commit's (its ``index/``, taken with ``git archive``), alternating, each restore in a fresh
process into a fresh collection.

The collection is synthetic: a collection of the caller's own vectors (no model), ``--documents`` documents of
one chunk each, texts of 40 words drawn from a 2,000-word made-up vocabulary, three metadata fields, random
unit vectors of ``--dimension``. It is snapshotted once per FAISS factory (``IDMap2,Flat`` as a collection
starts, ``IVF1024,Flat`` as a rebuild makes one past 50,000 chunks). The in-memory BM25 that a version builds
in the background after it opens is waited out and reported apart: both sides build it the same way.

    nice -n 10 .venv/bin/python benchmarks/restore_import.py --documents 100000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "b3b9c60"  # main before restores imported: the last whose restore adopted the store and FAISS file
FACTORIES = ("IDMap2,Flat", "IVF1024,Flat")


def measure(archive: Path, dimension: int, work: Path) -> dict:
    """One restore with the code first on ``sys.path`` (run in a process of its own: ``--measure``)."""
    from index.build.own_vectors import OwnVectors
    from index.search_index import SearchIndex

    index = SearchIndex.open(work / "target", OwnVectors(dimension))
    try:
        started = time.perf_counter()
        result = index.restore(archive)
        restored = time.perf_counter() - started
        index.wait_for_lexical()
        lexical = time.perf_counter() - started - restored
        stats = index.stats()
    finally:
        index.close()
    return {
        "restore_seconds": round(restored, 3),
        "bm25_after_seconds": round(lexical, 3),
        "documents": result["documents"],
        "vectors": stats["vectors"],
        "peak_rss_mb": peak_rss_mb(),
    }


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: ``ru_maxrss`` would carry the parent's over ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def build_archives(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """The synthetic collection, snapshotted once per factory (this checkout's code; the format is the same)."""
    import numpy as np

    from index.build.builder import attach_vectors
    from index.build.own_vectors import OwnVectors
    from index.records import Document
    from index.search_index import SearchIndex

    rng, words = random.Random(0), [f"w{n:04d}x" for n in range(2000)]
    vectors = np.random.default_rng(0)
    index = SearchIndex.open(work / "source", OwnVectors(args.dimension))
    archives = {}
    try:
        for start in range(0, args.documents, 2000):
            count = min(2000, args.documents - start)
            docs = [
                Document(
                    f"doc-{start + i}",
                    " ".join(rng.choice(words) for _ in range(40)),
                    {
                        "n": start + i,
                        "color": rng.choice(["red", "green", "blue"]),
                        "day": f"2024-01-{1 + i % 28:02d}",
                    },
                )
                for i in range(count)
            ]
            matrix = vectors.standard_normal((count, args.dimension)).astype(np.float32)
            matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
            index.commit(attach_vectors(index.prepare(docs), matrix))
        for factory in args.factories:
            live = (
                index._live
            )  # the benchmark's own index: FAISS remade with this factory before the snapshot
            live.manifest["factory"] = factory
            live.rebuild_vectors("benchmark", f"{factory} for the benchmark")
            entry = index.snapshot(work / "snapshots")
            archives[factory] = work / "snapshots" / entry["name"]
    finally:
        index.close()
    return archives


def restore_in_process(code: Path, archive: Path, dimension: int, work: Path) -> dict:
    target = work / "restore"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    command = [sys.executable, __file__, "--measure", str(archive), "--code", str(code)]
    command += ["--dimension", str(dimension), "--work", str(target)]
    env = os.environ | {"PYTHONPATH": str(code)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    shutil.rmtree(target, ignore_errors=True)
    if done.returncode:
        raise RuntimeError(f"restore with {code} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def git(*arguments: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *arguments], capture_output=True, text=True, check=True
    ).stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--factories", nargs="+", default=list(FACTORIES))
    parser.add_argument("--baseline", default=BASELINE, help="the commit whose restore is the old copy")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "restore_import.json")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # one restore, in a child process
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        sys.path.insert(0, str(args.code))  # its index/ before any other
        print(json.dumps(measure(args.measure, args.dimension, args.work)))
        return

    sys.path.insert(0, str(ROOT))
    from harness.provenance import command, load_average

    with tempfile.TemporaryDirectory(prefix="restore-import-") as folder:
        work = Path(folder)
        baseline = work / "baseline"
        baseline.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.baseline, "index"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive.stdout, check=True)
        load_before = load_average()
        started = time.perf_counter()
        archives = build_archives(args, work)
        built = time.perf_counter() - started
        factories = {}
        for factory, path in archives.items():
            runs: dict[str, list[dict]] = {"copy": [], "import": []}
            for _ in range(args.repeats):  # alternating, so a change in the machine's load hits both
                runs["copy"].append(restore_in_process(baseline, path, args.dimension, work))
                runs["import"].append(restore_in_process(ROOT, path, args.dimension, work))
            medians = {side: statistics.median(r["restore_seconds"] for r in rs) for side, rs in runs.items()}
            factories[factory] = {
                "archive_bytes": path.stat().st_size,
                "median_restore_seconds": medians,
                "import_over_copy": round(medians["import"] / medians["copy"], 2),
                "runs": runs,
            }
            print(factory, json.dumps(factories[factory]["median_restore_seconds"]), flush=True)
    result = {
        "command": command(),
        "what": "SearchIndex.restore of one archive: the baseline's copy of its store and FAISS file against "
        "this checkout's import (rows checked one by one into a new store, FAISS rebuilt), each restore in a "
        "fresh process into a fresh collection, alternating; bm25_after_seconds is the in-memory BM25 built "
        "after the restore returns, the same on both sides",
        "data": "synthetic: own-vectors collection, one chunk per document, 40-word texts from a made-up "
        "2,000-word vocabulary, 3 metadata fields, random unit vectors",
        "documents": args.documents,
        "dimension": args.dimension,
        "baseline_commit": git("rev-parse", args.baseline).strip(),
        "head_commit": git("rev-parse", "HEAD").strip(),
        "working_tree_clean": not git("status", "--porcelain", "--untracked-files=no").strip(),
        "build_and_snapshot_seconds": round(built, 1),
        "factories": factories,
        "load_average_before_and_after": [load_before, load_average()],
        "cpu_count": os.cpu_count(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {f: v["median_restore_seconds"] | {"ratio": v["import_over_copy"]} for f, v in factories.items()}
        )
    )


if __name__ == "__main__":
    main()
