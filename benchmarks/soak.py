"""Soak: mixed traffic at 32 connections with Debian's `wrk` against `cloze serve` on the demo index, while
collections are created, filled, snapshotted, restored and deleted with keys scoped to them.

    apt-get install -y wrk
    python benchmarks/soak.py --minutes 10 --out benchmarks/results/soak.json

One `wrk` process per route (a Python client saturates a core by itself here near 170 requests/s and would
measure itself), their connections adding up to 32: searches in each mode (dense, BM25, hybrid, filtered
hybrid), /embed, /fill-mask, upserts and deletes of a rotating set of ids. Each wrk's Lua script counts
statuses and reports p50/p99 latency. The server runs with keys: wrk sends the admin key; beside it, Python
threads (``harness.lifecycle``) run collection lifecycles with scoped write keys (create, upserts, search,
the other collection's key refused, snapshot, restore of the stored snapshot and of its download by upload,
delete), snapshot the default collection, and upsert uniquely named documents there; every write they had
acknowledged is checked where it must be (present, or gone after a restore to an earlier snapshot). A
warm-up of the same mix (lifecycles included) runs first; the server's RSS is sampled every 5 s from /proc, and growth is the last
minute's highest RSS over the RSS when the warm-up ended.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.lifecycle import ADMIN_KEY, SCOPED_KEYS, AcknowledgedWriter, Lifecycle  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from harness.servers import serve_process  # noqa: E402

QUERIES = [
    "liberty and the constitution",
    "the union of the states",
    "war and the hope of peace",
    "taxes, debt and the public credit",
    "duties of the citizen",
    "freedom of religion and of the press",
    "the economy and the working man",
    "relations with foreign nations",
]


# route name -> (connections, method, path, bodies)
def routes() -> dict[str, tuple[int, str, str, list[str]]]:
    search = lambda mode, **extra: [  # noqa: E731
        json.dumps({"query": q, "mode": mode, "top_k": 10, **extra}) for q in QUERIES
    ]
    docs = [
        json.dumps([{"id": f"soak-{i}", "text": f"{q}. " * 12 + f"soak document {i}", "metadata": {"n": i}}])
        for i, q in enumerate(QUERIES * 8)
    ]
    return {
        "search dense": (6, "POST", "/search", search("dense")),
        "search bm25": (6, "POST", "/search", search("bm25")),
        "search hybrid": (6, "POST", "/search", search("hybrid", include_text=True)),
        "search hybrid filtered": (
            2,
            "POST",
            "/search",
            search("hybrid", filter={"year": [1789, 1861, 1933, 2009]}),
        ),
        "embed": (4, "POST", "/embed", [json.dumps({"inputs": [q, q + " again"]}) for q in QUERIES]),
        "fill-mask": (
            2,
            "POST",
            "/fill-mask",
            [json.dumps({"inputs": f"{q} is a [MASK] topic ."}) for q in QUERIES],
        ),
        "upsert": (4, "PUT", "/documents", docs),
        "delete": (2, "DELETE", "/documents/soak-{i}", [""] * 64),
    }


LUA = r"""
local bodies = {BODIES}
local method, path = "{METHOD}", "{PATH}"
local i = 0
counts = {}  -- a global: done() reads it per thread with thread:get
function request()
  i = i % #bodies + 1
  local p = string.gsub(path, "{i}", tostring(i - 1))
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer {KEY}"}
  if bodies[i] == "" then return wrk.format(method, p, headers) end
  return wrk.format(method, p, headers, bodies[i])
end
function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local merged = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts")
    for k, v in pairs(c) do merged[tostring(k)] = (merged[tostring(k)] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(merged) do table.insert(parts, string.format('"%s": %d', k, v)) end
  io.write(string.format(
    'RESULT {"requests": %d, "socket_errors": %d, "timeouts": %d, "p50_ms": %.2f, "p99_ms": %.2f, ' ..
    '"max_ms": %.2f, "statuses": {%s}}\n',
    summary.requests, summary.errors.connect + summary.errors.read + summary.errors.write,
    summary.errors.timeout, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, table.concat(parts, ", ")))
end
"""


def lua_script(method: str, path: str, bodies: list[str]) -> str:
    quoted = ", ".join(json.dumps(b) for b in bodies)  # JSON strings are valid Lua strings here
    script = LUA.replace("{BODIES}", "{" + quoted + "}").replace("{METHOD}", method).replace("{PATH}", path)
    return script.replace("{KEY}", ADMIN_KEY)


def run_mix(url: str, seconds: int, work: Path) -> dict[str, dict]:
    processes = {}
    for name, (connections, method, path, bodies) in routes().items():
        script = work / f"{name.replace(' ', '_')}.lua"
        script.write_text(lua_script(method, path, bodies))
        processes[name] = subprocess.Popen(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", str(script), url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    results = {}
    for name, process in processes.items():
        out, _ = process.communicate()
        line = next((line for line in out.splitlines() if line.startswith("RESULT ")), None)
        results[name] = json.loads(line[7:]) if line else {"error": out[-2000:]}
        if line:
            results[name]["requests_per_s"] = round(results[name]["requests"] / seconds, 1)
    return results


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 5.0):
        super().__init__(daemon=True)
        self.pid, self.every, self.samples = pid, every, []
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.samples.append((round(time.monotonic() - started, 1), int(line.split()[1]) / 1024))
            self.stop.wait(self.every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--warmup-seconds", type=int, default=60)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/soak.json"))
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("soak.py needs wrk: apt-get install -y wrk")
    demo = ROOT / "data" / "demo-index"
    if not demo.is_dir():
        raise SystemExit(f"no demo index at {demo}: run `make demo-index` first")
    work = Path(tempfile.mkdtemp(prefix="cloze-soak-"))
    shutil.copytree(demo, work / "index")
    env = {
        "CLOZE_INDEX": str(work / "index"),
        "CLOZE_LOG_LEVEL": "warning",
        "CLOZE_API_KEYS": ADMIN_KEY,
        "CLOZE_COLLECTION_API_KEYS": ",".join(f"{key}=write:{name}" for name, key in SCOPED_KEYS.items()),
    }
    keyless = ("CLOZE_READ_API_KEYS", "CLOZE_FILL_MASK_MODEL")
    log_path = work / "server.log"
    seconds = int(args.minutes * 60)
    with serve_process(env, log_path, timeout=300, drop=keyless) as (url, process):
        time.sleep(5)  # the fill-mask model loads just after readiness
        sampler = RssSampler(process.pid)
        sampler.start()
        load_before = load_average()
        side = [Lifecycle(url), AcknowledgedWriter(url)]  # the warm-up runs the whole mix, lifecycles too
        for thread in side:
            thread.start()
        warmup = run_mix(url, args.warmup_seconds, work)
        warm_rss = sampler.samples[-1][1]
        warm_at = sampler.samples[-1][0]
        measured = run_mix(url, seconds, work)
        for thread in side:
            thread.finish()
        sampler.stop.set()
        sampler.join()
        load_after = load_average()
        acknowledged = side[1].check()
    samples = sampler.samples
    last_minute = [rss for t, rss in samples if t >= samples[-1][0] - 60]
    five_xx = sum(
        count
        for route in measured.values()
        for status, count in route.get("statuses", {}).items()
        if status.startswith("5")
    )
    lifecycle, writer = side[0].report(), side[1].report()
    five_xx += lifecycle["five_xx"] + writer["five_xx"]
    result = {
        "command": command(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "connections": sum(c for c, *_ in routes().values()),
        "seconds": seconds,
        "routes": measured,
        "warmup_routes": warmup,
        "total_requests": sum(r.get("requests", 0) for r in measured.values())
        + lifecycle["requests"]
        + writer["requests"],
        "server_5xx": five_xx,
        "lifecycle": lifecycle,
        "acknowledged_writer": writer | {"final_check": acknowledged},
        "acknowledged_writes_checked": lifecycle["writes_checked"] + acknowledged["checked"],
        "acknowledged_writes_lost": lifecycle["writes_lost"] + acknowledged["lost"],
        "rss_mb": {
            "after_warmup": round(warm_rss, 1),
            "after_warmup_at_s": warm_at,
            "last_minute_max": round(max(last_minute), 1),
            "max": round(max(rss for _, rss in samples), 1),
            "growth_after_warmup": round(max(last_minute) / warm_rss - 1, 4),
            "samples": [[t, round(rss, 1)] for t, rss in samples],
        },
        "tracebacks_in_server_log": log_path.read_text().count("Traceback"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "machine": f"{os.cpu_count()} cores, shared with other work (see load averages)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("warmup_routes",)}, indent=1)[:4000])


if __name__ == "__main__":
    main()
