"""What a restart costs the filter columns: read from the store (``Columns.load``, before) against mapped from
the files a snapshot saved (``Columns.open``, after), side by side on the same store, each in a fresh process.

Synthetic documents of one chunk each, written straight into a store (vectors of 4 dimensions: the columns
never read them), with ``filtered_search``'s five metadata fields (``tenant`` 1,000 values, ``year``, an ISO
``published`` date, ``kind`` 10 values, ``tags`` 2 of 20). Per size: open seconds, RSS growth steady after the
open and after a first filter over three fields (the pages it touches), the peak (``VmHWM``) during the open, and
the files' bytes per document on disk. Another benchmark times a restart through the same two calls.

    nice -n 10 .venv/bin/python benchmarks/column_files.py --documents 100000 500000 --work runs/column-files
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.filtered_search import synthetic_metadata  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402

FILTER = {"kind": "k3", "year": {"$gte": 2005}, "tags": "g7"}  # ~2.5% of the documents


def memory() -> dict[str, float]:
    """This process's resident and peak resident MB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {name: int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM")}


def write_store(folder: Path, documents: int) -> Path:
    from index.records import Document
    from index.storage.store import DocumentStore
    from index.text.chunking import Chunk

    path = folder / "store.sqlite"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    store = DocumentStore(path)
    for start in range(0, documents, 10_000):
        rng = random.Random(start)
        count = min(10_000, documents - start)
        vector = np.ones((1, 4), np.float32) / 2
        items = [
            (Document(f"s{i}", f"s{i}", synthetic_metadata(i, rng)), [Chunk(0, f"s{i}", 1)], vector)
            for i in range(start, start + count)
        ]
        with store.transaction() as conn:
            store.write_documents(conn, items, log=False)
    store.close()
    return path


def measure(folder: Path, how: str) -> dict:
    """In a fresh process: open the columns ``how`` (``load``: from the store; ``open``: the saved files)."""
    from index.storage.columns import Columns
    from index.storage.store import DocumentStore

    store = DocumentStore(folder / "store.sqlite", create=False, read_only=True)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to VmRSS: the peak is the open's own
    before = memory()
    started = time.perf_counter()
    columns = Columns.load(store) if how == "load" else Columns.open(folder)[0]
    seconds = time.perf_counter() - started
    opened = memory()
    started = time.perf_counter()
    matches = int(np.count_nonzero(columns.select(FILTER).documents))
    first_filter = time.perf_counter() - started
    filtered = memory()
    return {
        "open_seconds": round(seconds, 3),
        "rss_mb_after_open": round(opened["VmRSS"] - before["VmRSS"], 1),
        "peak_mb_during_open": round(opened["VmHWM"] - before["VmRSS"], 1),
        "first_filter_seconds": round(first_filter, 3),
        "rss_mb_after_first_filter": round(filtered["VmRSS"] - before["VmRSS"], 1),
        "matches": matches,
        "in_memory_bytes_per_document": round(columns.nbytes() / max(int(columns.alive.sum()), 1), 1),
    }


def run(folder: Path, how: str) -> dict:
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.column_files import measure; "
        f"from pathlib import Path; print(json.dumps(measure(Path({str(folder)!r}), {how!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, nargs="+", default=[100_000, 500_000])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/column_files.json")
    args = parser.parse_args()
    from index.storage.columns import FILES, POINTER, Columns
    from index.storage.store import DocumentStore

    results = []
    for documents in args.documents:
        folder = args.work / str(documents)
        write_store(folder, documents)
        store = DocumentStore(folder / "store.sqlite", create=False)
        started = time.perf_counter()
        Columns.save_from_store(store, folder)
        saved = time.perf_counter() - started
        store.close()
        on_disk = sum(p.stat().st_size for p in (folder / FILES).rglob("*") if p.is_file())
        on_disk += (folder / POINTER).stat().st_size
        row: dict = {"documents": documents, "save_seconds_from_store": round(saved, 2)}
        row["disk_bytes_per_document"] = round(on_disk / documents, 1)
        for _ in range(args.rounds):  # alternated, so the machine's load falls on both alike
            for how, name in (("load", "before"), ("open", "after")):
                row.setdefault(name, []).append(run(folder, how))
        results.append(row)
        print(json.dumps(row), flush=True)
    out = {"command": command(), "load_average": load_average(), "filter": FILTER, "results": results}
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
