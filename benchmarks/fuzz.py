"""Schemathesis over /openapi.json against `cloze serve`: generated requests to every operation, with a write
key, with a key scoped to one collection, and without, checking that none gets a 5xx (``not_a_server_error``).

    python benchmarks/fuzz.py --examples 200 --out benchmarks/results/fuzz.json

The server runs keyed (write, read and collection-scoped keys) on loopback with the shipped models over a
fresh index that holds 200 documents of the demo corpus (small, so the fuzzer's rebuilds stay short), plus a
collection (``fuzz-a``, the scoped key's) with documents and a snapshot, so the collection and snapshot
routes meet real targets as well as made-up ones. Counts come from
schemathesis's summary ("Test cases: N generated"); statuses from its NDJSON event stream.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402
from harness.servers import READ_KEY, WRITE_KEY, serve_process  # noqa: E402

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
SCOPED_KEY, SCOPED_COLLECTION = "fuzz-scoped-key-0123456789", "fuzz-a"


def rss_mb(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = round(int(value.split()[0]) / 1024, 1)
    return out


def seed_documents(url: str, count: int) -> None:
    with gzip.open(ROOT / "app/demo/corpus.jsonl.gz", "rt") as lines:
        docs = [json.loads(line) for _, line in zip(range(count), lines, strict=False)]
    body = [
        {
            "id": d["id"],
            "text": d["text"],
            "metadata": {k: v for k, v in d.items() if k not in ("id", "text")},
        }
        for d in docs
    ]
    headers = {"Authorization": f"Bearer {WRITE_KEY}"}
    for start in range(0, len(body), 50):
        httpx.put(
            url + "/documents", json=body[start : start + 50], headers=headers, timeout=300
        ).raise_for_status()


def seed_collection(url: str) -> None:
    """A second collection with a few documents and a snapshot of them."""
    headers = {"Authorization": f"Bearer {WRITE_KEY}"}
    base = f"{url}/collections/{SCOPED_COLLECTION}"
    httpx.post(url + "/collections", json={"name": SCOPED_COLLECTION}, headers=headers).raise_for_status()
    docs = [{"id": f"f{i}", "text": f"fuzzed collection document {i}"} for i in range(10)]
    httpx.put(base + "/documents", json=docs, headers=headers, timeout=120).raise_for_status()
    httpx.post(base + "/snapshots", headers=headers, timeout=120).raise_for_status()


def run_schemathesis(url: str, label: str, header: str | None, examples: int, workdir: Path) -> dict:
    events = workdir / f"{label}.ndjson"
    command = [
        str(SCHEMATHESIS),
        "run",
        url + "/openapi.json",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        str(examples),
        "--seed",
        "19",
        "--workers",
        "2",
        "--continue-on-failure",
        "--request-timeout",
        "120",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(events),
        "--no-color",
        "--suppress-health-check",
        "all",
    ]
    if header:
        command += ["--header", header]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    took = time.perf_counter() - started
    generated = re.search(r"Test cases:\s*\n\s*(\d+) generated", result.stdout)
    cases = int(generated.group(1)) if generated else 0
    failures, statuses = [], {}
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        payload = event.get("ScenarioFinished")
        if payload is None:
            continue
        for interaction in payload.get("recorder", {}).get("interactions", {}).values():
            code = (interaction.get("response") or {}).get("status_code")
            if code is None:
                continue
            statuses[str(code)] = statuses.get(str(code), 0) + 1
            if code >= 500:
                failures.append({"status": code, "request": interaction.get("request", {}).get("uri")})
    return {
        "label": label,
        "test_cases": cases,  # schemathesis's own count ("N generated"), all phases
        "recorded_responses_by_status": dict(sorted(statuses.items())),
        "server_errors": len(failures) + len(re.findall(r"Server error", result.stdout)),
        "server_error_examples": failures[:10],
        "schemathesis_exit_code": result.returncode,
        "seconds": round(took, 1),
        "summary": result.stdout[-2500:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=150, help="max examples per operation and phase")
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/fuzz.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cloze-fuzz-"))
    env = {
        "CLOZE_INDEX": str(work / "index"),
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_READ_API_KEYS": READ_KEY,
        "CLOZE_COLLECTION_API_KEYS": f"{SCOPED_KEY}=write:{SCOPED_COLLECTION}",
        "CLOZE_LOG_LEVEL": "warning",
    }
    log_path = work / "server.log"
    load_before = load_average()
    with serve_process(env, log_path, timeout=300, drop=("CLOZE_FILL_MASK_MODEL",)) as (url, process):
        seed_documents(url, args.documents)
        seed_collection(url)
        runs = [
            run_schemathesis(
                url, "with a write key", f"Authorization: Bearer {WRITE_KEY}", args.examples, work
            ),
            run_schemathesis(
                url,
                "with a key scoped to one collection",
                f"Authorization: Bearer {SCOPED_KEY}",
                args.examples,
                work,
            ),
            run_schemathesis(url, "without keys", None, args.examples, work),
        ]
        alive = httpx.get(url + "/healthz", timeout=10).status_code
        memory = rss_mb(process.pid)
    tracebacks = log_path.read_text().count("Traceback")
    result = {
        "command": command(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
        "test_cases": sum(r["test_cases"] for r in runs),
        "server_errors": sum(r["server_errors"] for r in runs),
        "healthz_after": alive,
        "server_rss_mb": memory,
        "tracebacks_in_server_log": tracebacks,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": load_average(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    for run in runs:
        print(run["label"], run["test_cases"], "cases", run["server_errors"], "server errors")
    if tracebacks:
        print(f"server log with tracebacks: {log_path}")


if __name__ == "__main__":
    main()
