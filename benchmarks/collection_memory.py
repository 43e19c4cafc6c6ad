"""Memory per collection: the resident set of one `cloze serve` (one model) holding 1, then 100 empty
collections, side by side in one run.

    python benchmarks/collection_memory.py --out benchmarks/results/collection_memory.json

One server on the bundled model (CLOZE_BACKEND=auto) starts with no collection besides `default`; RSS is read
from /proc after a warm-up search, after `POST /collections` makes the first collection, and after it makes
the rest up to `--count`; then one search goes to every collection (a search opens what a collection reads
lazily: its BM25 arrays) and RSS is read again. A collection holds no copy of a model: every one here embeds
with the one `default` model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402
from harness.servers import serve_process  # noqa: E402

SEARCH = {"query": "how do vaccines work", "top_k": 5}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def create(client: httpx.Client, names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        client.post("/collections", json={"name": name}).raise_for_status()
    return (time.perf_counter() - started) / max(1, len(names))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--out", default="benchmarks/results/collection_memory.json")
    args = parser.parse_args()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="collection-memory-") as tmp:
        env = {
            "CLOZE_INDEX": f"{tmp}/index",
            "CLOZE_MAX_COLLECTIONS": str(args.count),
            "CLOZE_LOG_LEVEL": "warning",
            "CLOZE_ACCESS_LOG": "false",
        }
        with (
            serve_process(env, Path(tmp) / "server.log", timeout=600) as (url, process),
            httpx.Client(base_url=url, timeout=120) as client,
        ):
            client.post("/search", json=SEARCH).raise_for_status()
            rows = [{"collections": 0, "rss_mib": rss_mib(process.pid)}]
            names = [f"c{i:03d}" for i in range(args.count)]
            first_s = create(client, names[:1])
            rows.append({"collections": 1, "rss_mib": rss_mib(process.pid), "create_s": round(first_s, 3)})
            rest_s = create(client, names[1:])
            rows.append(
                {"collections": args.count, "rss_mib": rss_mib(process.pid), "create_s": round(rest_s, 3)}
            )
            for name in names:
                client.post(f"/collections/{name}/search", json=SEARCH).raise_for_status()
            rows.append(
                {"collections": args.count, "rss_mib": rss_mib(process.pid), "after": "one search in each"}
            )
    one, many = rows[1]["rss_mib"], rows[-1]["rss_mib"]
    result = {
        "command": command(),
        "model": "the bundled all-MiniLM-L6-v2 (CLOZE_BACKEND=auto), one for every collection",
        "rows": rows,
        "per_collection_mib": round((many - one) / max(1, args.count - 1), 2),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
