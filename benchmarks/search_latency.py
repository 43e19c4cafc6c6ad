"""/search latency on the SciFact corpus through a real server: p50 / p99 at concurrency 1 and 16.

Builds (or reuses) the SciFact index with the bundled model, starts `cloze serve` on a free loopback port,
and replays real SciFact queries: a bounded number of requests per setting, then it stops.
The load generator shares the machine's 2 cores with the server, so the figures include its cost.

    .venv/bin/python benchmarks/search_latency.py [--requests 400] [--modes hybrid,dense,bm25]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

from harness.provenance import command  # noqa: E402


def scifact_index(backend: str) -> Path:
    """The same index `cloze eval beir` builds for SciFact (reused when input and model are unchanged)."""
    from encoder_runtime import load_encoder
    from encoder_training.evaluation.beir import corpus_file, default_index_dir
    from index.builder import BuildOptions, build_if_needed

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--modes", default="hybrid,dense,bm25")
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search_latency.json"))
    args = parser.parse_args()

    from harness.servers import free_port, wait_until

    index = scifact_index(args.backend)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "CLOZE_INDEX": str(index),
        "CLOZE_BACKEND": args.backend,
        "CLOZE_LOG_LEVEL": "warning",
    }
    log = Path(tempfile.gettempdir()) / "cloze-search-latency-server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    rows = []
    try:
        wait_until(url + "/readyz", server, log, 600)
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
    finally:
        server.terminate()
        server.wait(60)
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
