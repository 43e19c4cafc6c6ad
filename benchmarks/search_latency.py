"""/search latency on the SciFact corpus through a real server: p50 / p99 at concurrency 1 and 16.

Builds (or reuses) the SciFact index with the bundled model, starts `cloze serve` on a free loopback port,
and replays real SciFact queries: a bounded number of requests per setting, then it stops.
The load generator shares the machine's 2 cores with the server, so the figures include its cost.

    .venv/bin/python benchmarks/search_latency.py [--requests 400] [--modes hybrid,dense,bm25]

``--during-upsert``: the same server on a copy of the index, c=4 hybrid searches alone and then while one
client sends 8 ``PUT /documents`` of 64 SciFact documents back to back; search p50/p99 and upsert docs/s.
``--server-root`` runs the server from another checkout (to measure a commit before a change, same script):

    .venv/bin/python benchmarks/search_latency.py --during-upsert [--server-root runs/before] [--label after]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCIFACT = ROOT.parent / "shared" / "data" / "beir-scifact"
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402
from harness.servers import serve_process  # noqa: E402


def scifact_index(backend: str) -> Path:
    """The same index `cloze eval beir` builds for SciFact (reused when input and model are unchanged)."""
    from encoder_runtime import load_encoder
    from evaluation.beir import corpus_file, default_index_dir
    from index.build.builder import BuildOptions, build_if_needed

    encoder = load_encoder(backend=backend)
    folder = default_index_dir(SCIFACT, encoder, backend)
    build_if_needed(folder, corpus_file(SCIFACT), encoder, BuildOptions(show_progress=True))
    return folder


def queries() -> list[str]:
    with (SCIFACT / "queries.jsonl").open() as handle:
        return [json.loads(line)["text"] for line in handle if line.strip()]


async def load(url: str, texts: list[str], mode: str, concurrency: int, requests: int) -> list[float]:
    latencies: list[float] = []
    todo = iter(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        for n in todo:
            started = time.perf_counter()
            reply = await client.post(
                "/search", json={"query": texts[n % len(texts)], "mode": mode, "top_k": 10}
            )
            latencies.append((time.perf_counter() - started) * 1000)
            reply.raise_for_status()

    async with httpx.AsyncClient(
        base_url=url, timeout=30, limits=httpx.Limits(max_connections=concurrency)
    ) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return latencies


def bulk_documents(count: int = 64) -> list[dict]:
    """SciFact abstracts as upsert bodies (title and text): the documents a bulk load sends."""
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line, _ in zip(handle, range(count * 8), strict=False)]
    return [{"text": f"{r['title']} {r['text']}", "metadata": {"source": r["_id"]}} for r in rows]


async def during_upsert(url: str, texts: list[str], requests: int, rounds: int) -> dict:
    """c=4 hybrid searches, first ``requests`` alone, then for as long as one client upserts ``rounds``
    requests of 64 documents back to back."""
    alone = await load(url, texts, "hybrid", 4, requests)
    pool = bulk_documents()
    done = asyncio.Event()
    upserted, upsert_seconds = 0, 0.0
    during: list[float] = []

    async def upsert_stream() -> None:
        nonlocal upserted, upsert_seconds
        try:
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                for round_ in range(rounds):
                    start = (round_ * 64) % len(pool)
                    batch = [
                        {"id": f"bulk-{round_}-{i}", **d} for i, d in enumerate(pool[start : start + 64])
                    ]
                    started = time.perf_counter()
                    reply = await client.put("/documents", json=batch)
                    reply.raise_for_status()
                    upsert_seconds += time.perf_counter() - started
                    upserted += reply.json()["upserted"]
        finally:
            done.set()

    async def searcher(client: httpx.AsyncClient, n: int) -> None:
        while not done.is_set():
            started = time.perf_counter()
            reply = await client.post("/search", json={"query": texts[n % len(texts)], "mode": "hybrid"})
            if not done.is_set():  # a search that ends after the last upsert is not "during"
                during.append((time.perf_counter() - started) * 1000)
            reply.raise_for_status()
            n += 4

    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=4)) as client:
        await asyncio.gather(upsert_stream(), *(searcher(client, n) for n in range(4)))

    def summary(latencies: list[float]) -> dict:
        return {
            "requests": len(latencies),
            "p50_ms": round(float(np.percentile(latencies, 50)), 1),
            "p99_ms": round(float(np.percentile(latencies, 99)), 1),
        }

    return {
        "search_alone": summary(alone),
        "search_during_upsert": summary(during),
        "upsert": {
            "requests": rounds,
            "seconds": round(upsert_seconds, 1),
            "documents": upserted,
            "docs_per_s": round(upserted / upsert_seconds, 1) if upsert_seconds else None,
        },
    }


def run_during_upsert(args: argparse.Namespace, index: Path) -> None:
    copy = Path(tempfile.mkdtemp(prefix="cloze-upsert-bench-")) / "index"
    shutil.copytree(index, copy)  # the upserts must not change the cached SciFact index
    env = {"CLOZE_INDEX": str(copy), "CLOZE_BACKEND": args.backend, "CLOZE_LOG_LEVEL": "warning"}
    root = Path(args.server_root).resolve()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    log = Path(tempfile.gettempdir()) / f"cloze-upsert-bench-{args.label}.log"
    try:
        with serve_process(env | {"CLOZE_ACCESS_LOG": "false"}, log, timeout=600, checkout=root) as (url, _):
            texts = queries()
            asyncio.run(load(url, texts, "hybrid", 4, 40))  # warm-up
            arm = asyncio.run(during_upsert(url, texts, args.requests, args.upsert_rounds))
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    arm |= {
        "label": args.label,
        "server_root": str(root),
        "commit": commit or args.server_commit,
        "command": command(),
        "load_average": load_average(),
    }
    print(json.dumps(arm, indent=2))
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    result.setdefault("workload", {
        "index": "SciFact (5,183 abstracts), bundled MiniLM, " + args.backend,
        "searches": f"hybrid /search at concurrency 4: {args.requests} alone, then as many as run during the upserts",
        "upserts": f"one client, {args.upsert_rounds} PUT /documents of 64 SciFact abstracts (new ids) back to back",
        "machine": "2 shared CPU cores, other sessions' work running: the two arms were run back to back",
    })  # fmt: skip
    result.setdefault("arms", {})[args.label] = arm
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out_path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--modes", default="hybrid,dense,bm25")
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search_latency.json"))
    parser.add_argument("--during-upsert", action="store_true", help="search latency during a bulk upsert")
    parser.add_argument("--server-root", default=str(ROOT), help="checkout the server runs from")
    parser.add_argument("--server-commit", default="", help="recorded when --server-root is no git checkout")
    parser.add_argument("--upsert-rounds", type=int, default=8, help="PUT /documents of 64 during searches")
    parser.add_argument("--label", default="after", help="the arm's name in the --during-upsert result")
    args = parser.parse_args()

    index = scifact_index(args.backend)
    if args.during_upsert:
        if args.out == parser.get_default("out"):
            args.out = str(ROOT / "benchmarks" / "results" / "search_during_upsert.json")
        return run_during_upsert(args, index)
    env = {"CLOZE_INDEX": str(index), "CLOZE_BACKEND": args.backend, "CLOZE_LOG_LEVEL": "warning"}
    log = Path(tempfile.gettempdir()) / "cloze-search-latency-server.log"
    rows = []
    with serve_process(env, log, timeout=600) as (url, _):
        texts = queries()
        asyncio.run(load(url, texts, "hybrid", 4, 40))  # warm-up
        for mode in args.modes.split(","):
            for concurrency in (1, 16):
                latencies = asyncio.run(load(url, texts, mode, concurrency, args.requests))
                rows.append(
                    {
                        "mode": mode,
                        "concurrency": concurrency,
                        "requests": len(latencies),
                        "p50_ms": float(np.percentile(latencies, 50)),
                        "p99_ms": float(np.percentile(latencies, 99)),
                    }
                )
                print(
                    f"{mode:7s} c={concurrency:<3d} p50 {rows[-1]['p50_ms']:7.1f} ms  p99 {rows[-1]['p99_ms']:7.1f} ms"
                )
    result = {
        "command": command(),
        "index": str(index),
        "backend": args.backend,
        "documents": 5183,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
