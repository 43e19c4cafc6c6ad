"""Snapshots at scale: how long a snapshot of a live collection takes, how large its archive is, what it does
to concurrent searches and writes, and how long a restore takes.

The corpus and index are ``filtered_search``'s (index_scale's real prose passages, bundled MiniLM, ONNX int8,
``IVF1024,Flat``), built once under ``--index-dir`` and reused. A real ``cloze serve`` serves it; two clients
search it (dense ``/search``, held-out queries) for ``--seconds`` alone, then again while the service writes
a snapshot (``POST /collections/default/snapshots``) and one client upserts 5 documents every 0.5 s: the
p99 of searches alone and during the snapshot come from the same run, side by side. Then the archive is
restored offline into an empty folder (``cloze index restore``) and by upload into the live service.

    nice -n 10 .venv/bin/python benchmarks/snapshot.py --passages 100000 --index-dir runs/snapshot-bench
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.filtered_search import build  # noqa: E402
from benchmarks.index_scale import split_sentences  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from harness.servers import serve_process  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SNAPSHOTS = "/collections/default/snapshots"


def built_index(args: argparse.Namespace) -> dict:
    """filtered_search's index (its build is reused when present; the encoder loads only to build one)."""
    from index.storage import layout

    if layout.current_version(args.index_dir / "index") is not None:
        return json.loads((args.index_dir / "build.json").read_text())
    from encoder_runtime import load_encoder

    return build(args, load_encoder(backend=args.backend))


class Searchers:
    """``clients`` threads searching back to back; each latency is kept with the instant it ended."""

    def __init__(self, url: str, queries: list[str], clients: int):
        self.url, self.queries, self.stop = url, queries, threading.Event()
        self.done: list[tuple[float, float, int]] = []  # (started, ended, status)
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(clients)]

    def run(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while not self.stop.is_set():
                query = self.queries[n % len(self.queries)]
                started = time.perf_counter()
                status = http.post("/search", json={"query": query, "top_k": 10, "mode": "dense"}).status_code
                self.done.append((started, time.perf_counter(), status))
                n += len(self.threads)

    def __enter__(self) -> Searchers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def between(self, start: float, end: float) -> dict:
        """Searches that overlapped [start, end]."""
        picked = [(e - s, code) for s, e, code in self.done if e >= start and s <= end]
        latencies = [1000 * seconds for seconds, _ in picked]
        return {
            "requests": len(picked),
            "non_200": sum(code != 200 for _, code in picked),
            "p50_ms": round(float(np.percentile(latencies, 50)), 1) if latencies else None,
            "p99_ms": round(float(np.percentile(latencies, 99)), 1) if latencies else None,
            "max_ms": round(max(latencies), 1) if latencies else None,
        }


def write_stream(url: str, stop: threading.Event, latencies: list[float]) -> None:
    """5 new documents every 0.5 s: writes must go on while the snapshot is written."""
    rng, serial = random.Random(3), 0
    words = "snapshot archive restore backup search index version store vector river city".split()
    with httpx.Client(base_url=url, timeout=120) as http:
        while not stop.is_set():
            docs = [
                {"id": f"during-{serial + i}", "text": " ".join(rng.choice(words) for _ in range(20))}
                for i in range(5)
            ]
            serial += 5
            started = time.perf_counter()
            assert http.put("/documents", json=docs).status_code == 200
            latencies.append(1000 * (time.perf_counter() - started))
            stop.wait(0.5)


def measure_snapshot(url: str, queries: list[str], args: argparse.Namespace) -> dict:
    with Searchers(url, queries, args.clients) as searchers:
        time.sleep(3)  # warm
        alone_start = time.perf_counter()
        time.sleep(args.seconds)
        alone = searchers.between(alone_start, time.perf_counter())
        stop, writes = threading.Event(), []
        writer = threading.Thread(target=write_stream, args=(url, stop, writes), daemon=True)
        writer.start()
        started = time.perf_counter()
        answer = httpx.post(url + SNAPSHOTS, timeout=1800)
        ended = time.perf_counter()
        stop.set()
        writer.join(timeout=120)
        during = searchers.between(started, ended)
    assert answer.status_code == 201, answer.text
    return {
        "snapshot": answer.json() | {"seconds": round(ended - started, 2)},
        "search_alone": alone,
        "search_during_snapshot": during,
        "writes_during_snapshot": {
            "requests": len(writes),
            "p50_ms": round(float(np.percentile(writes, 50)), 1) if writes else None,
            "max_ms": round(max(writes), 1) if writes else None,
        },
    }


def restore_offline(archive: Path, work: Path) -> float:
    target = work / "restored"
    shutil.rmtree(target, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "index", "restore", str(archive), "--collection", "default"]
        + ["--index", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    shutil.rmtree(target, ignore_errors=True)
    return round(seconds, 2)


def restore_upload(url: str, archive: Path) -> dict:
    started = time.perf_counter()
    with archive.open("rb") as body:
        answer = httpx.post(
            url + "/collections/default/restore",
            content=body,
            headers={"Content-Type": "application/octet-stream"},
            timeout=1800,
        )
    assert answer.status_code == 200, answer.text
    return answer.json() | {"seconds": round(time.perf_counter() - started, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--index-dir", type=Path, default=Path("/tmp/cloze-snapshot-bench"))
    parser.add_argument("--factories", default="IVF1024,Flat", help="the factory the index is built with")
    parser.add_argument("--seconds", type=float, default=30, help="searches alone before the snapshot")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument(
        "--settle", type=float, default=60, help="seconds after ready (the in-memory BM25 builds meanwhile)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "snapshot.json")
    args = parser.parse_args()

    info = built_index(args)
    index = args.index_dir / "index"
    snaps = args.index_dir / "snapshots"
    shutil.rmtree(snaps, ignore_errors=True)
    queries = split_sentences(random.Random(0))[0][:200]
    load_before = load_average()
    env = {
        "CLOZE_INDEX": str(index),
        "CLOZE_SNAPSHOTS_DIR": str(snaps),
        "CLOZE_BACKEND": "auto",
        "CLOZE_ACCESS_LOG": "false",
        "CLOZE_LOG_LEVEL": "info",
    }
    with serve_process(env, args.index_dir / "server.log", timeout=900) as (url, _):
        time.sleep(args.settle)
        measured = measure_snapshot(url, queries, args)
        archive = snaps / measured["snapshot"]["name"]
        uploaded = restore_upload(url, archive)
    offline = restore_offline(archive, args.index_dir)
    version = json.loads((index / "versions" / str(uploaded["version"]) / "manifest.json").read_text())
    result = {
        "command": command(),
        "passages": info["passages"],
        "chunks": info["chunks"],
        "factory": version["factory"],
        "backend": args.backend,
        "index_version_bytes": {
            name: (index / "versions" / str(uploaded["version"]) / name).stat().st_size
            for name in ("store.sqlite", "vectors.faiss")
        },
        "search_clients": args.clients,
        **measured,
        "restore_offline_seconds": offline,
        "restore_upload": uploaded,
        "load_average_before_and_after": [load_before, load_average()],
        "cpu_count": os.cpu_count(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
