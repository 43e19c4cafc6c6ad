"""Soak: mixed traffic at 32 connections with Debian's `wrk` against `cloze serve` on the demo index, while
collections are created, filled, snapshotted, restored and deleted with keys scoped to them.

    apt-get install -y wrk
    python benchmarks/soak.py --minutes 10 --out benchmarks/results/soak.json
    python benchmarks/soak.py --quick --out /tmp/soak.json   # 1 minute after 15 s of warm-up

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

The server is a replication writer (a moto S3 server on loopback) and a replica follows it (``--no-replica``: a
server alone, as before): every collection the lifecycles create, restore and delete, and every write. A `wrk`
of hybrid searches goes to the replica beside the mix; its RSS is sampled as the writer's, and its replication
state every 5 s. At the end, once the replica holds the writer's last sequence, every acknowledged write of
the default collection is read back from the writer and from the replica.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.lifecycle import ADMIN_KEY, SCOPED_KEYS, AcknowledgedWriter, Lifecycle  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from harness.replication import MotoServer, replication_env  # noqa: E402
from harness.servers import serve_process  # noqa: E402

QUICK = {"minutes": 1.0, "warmup_seconds": 15}
CONVERGE_S = 180  # after the load: the replica may be behind by whole bases of the lifecycles' collections
Served = tuple[str, subprocess.Popen]  # a server's url and process

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


def replica_routes() -> dict[str, tuple[int, str, str, list[str]]]:
    """Reads on the replica beside the writer's mix (a replica takes no writes)."""
    _, method, path, bodies = routes()["search hybrid"]
    return {"replica search hybrid": (4, method, path, bodies)}


def run_mix(url: str, seconds: int, work: Path, replica: str | None = None) -> dict[str, dict]:
    targets = [(url, routes())] + ([(replica, replica_routes())] if replica else [])
    processes = {}
    for target, named in targets:
        for name, (connections, method, path, bodies) in named.items():
            script = work / f"{name.replace(' ', '_')}.lua"
            script.write_text(lua_script(method, path, bodies))
            processes[name] = wrk(target, connections, seconds, script)
    results = {}
    for name, process in processes.items():
        out, _ = process.communicate()
        line = next((line for line in out.splitlines() if line.startswith("RESULT ")), None)
        results[name] = json.loads(line[7:]) if line else {"error": out[-2000:]}
        if line:
            results[name]["requests_per_s"] = round(results[name]["requests"] / seconds, 1)
    return results


def wrk(url: str, connections: int, seconds: int, script: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", str(script), url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 5.0):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float]] = []  # (seconds since start, MB)
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.samples.append((round(time.monotonic() - started, 1), int(line.split()[1]) / 1024))
            self.stop.wait(self.every)


class ReplicaWatch(threading.Thread):
    """Every 5 s, the default collection's sequence on the writer beside what the replica says of itself."""

    def __init__(self, writer: str, replica: str, every: float = 5.0):
        super().__init__(daemon=True)
        self.writer, self.replica, self.every = writer, replica, every
        self.samples: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            writer, replica = replication_state(self.writer), replication_state(self.replica)
            behind = None
            if writer.get("version") == replica.get("version") and replica.get("applied_seq") is not None:
                behind = writer["seq"] - replica["applied_seq"]
            said = {k: replica.get(k) for k in ("lag", "stale", "error")}
            self.samples.append({"t": round(time.monotonic() - started, 1), "behind": behind} | said)
            self.stop.wait(self.every)

    def report(self) -> dict:
        behind = [s["behind"] for s in self.samples if s["behind"] is not None]
        return {
            "max_behind_writer": max(behind, default=None),
            "samples_stale": sum(bool(s["stale"]) for s in self.samples),
            "samples_with_error": sum(bool(s["error"]) for s in self.samples),
            "samples": self.samples,
        }


def replication_state(url: str) -> dict:
    """The default collection's replication state on ``url``'s /readyz ({} when it does not answer)."""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        answer = httpx.get(url + "/readyz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        return answer.json()["collections"]["default"]["replication"]
    return {}


def converged(writer: str, replica: str, timeout: float = CONVERGE_S) -> float | None:
    """Seconds until the replica holds the writer's last sequence of the default collection; None: never."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        have, want = replication_state(replica), replication_state(writer)
        if want and [have.get("version"), have.get("applied_seq")] == [want.get("version"), want.get("seq")]:
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)
    return None


@contextlib.contextmanager
def servers(work: Path, env: dict[str, str], replica: bool) -> Iterator[tuple[Served, Served | None]]:
    """The server under load, (url, process); with ``replica`` it is a replication writer to a moto bucket on
    loopback, and a replica follows it on a volume of its own."""
    keyless = ("CLOZE_READ_API_KEYS", "CLOZE_FILL_MASK_MODEL")
    with contextlib.ExitStack() as stack:
        if replica:
            moto = MotoServer(work / "moto.log")
            stack.callback(moto.stop)
            env = (
                env
                | replication_env("writer", moto.url)
                | {"CLOZE_COLLECTIONS_DIR": str(work / "collections")}
            )
        writer = stack.enter_context(serve_process(env, work / "server.log", timeout=300, drop=keyless))
        follower = None
        if replica:
            own = {
                "CLOZE_INDEX": str(work / "replica"),
                "CLOZE_COLLECTIONS_DIR": str(work / "replica-collections"),
            }
            replica_env = env | replication_env("replica", moto.url) | own
            follower = stack.enter_context(
                serve_process(replica_env, work / "replica.log", timeout=300, drop=keyless)
            )
        yield writer, follower


def rss_summary(sampler: RssSampler, warm_at: float) -> dict:
    """RSS at the start, when the warm-up ended, at the end, and the last minute's highest against the warm."""
    samples = sampler.samples
    warm = next((rss for t, rss in samples if t >= warm_at), samples[-1][1])  # each sampler has its own clock
    last_minute = [rss for t, rss in samples if t >= samples[-1][0] - 60]
    return {
        "start": round(samples[0][1], 1),
        "after_warmup": round(warm, 1),
        "after_warmup_at_s": warm_at,
        "end": round(samples[-1][1], 1),
        "last_minute_max": round(max(last_minute), 1),
        "max": round(max(rss for _, rss in samples), 1),
        "growth_after_warmup": round(max(last_minute) / warm - 1, 4),
        "samples": [[t, round(rss, 1)] for t, rss in samples],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--warmup-seconds", type=int, default=60)
    parser.add_argument("--replica", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK}: shows the soak works")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/soak.json"))
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
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
    seconds = int(args.minutes * 60)
    with servers(work, env, args.replica) as ((url, process), follower):
        time.sleep(5)  # the fill-mask model loads just after readiness
        samplers = [RssSampler(process.pid)] + ([RssSampler(follower[1].pid)] if follower else [])
        watch = ReplicaWatch(url, follower[0]) if follower else None
        watchers: list[RssSampler | ReplicaWatch] = [*samplers, *([watch] if watch else [])]
        for watcher in watchers:
            watcher.start()
        load_before = load_average()
        lifecycles, writes = Lifecycle(url), AcknowledgedWriter(url)
        side = [lifecycles, writes]  # the warm-up runs the whole mix, lifecycles too
        for thread in side:
            thread.start()
        replica_url = follower[0] if follower else None
        warmup = run_mix(url, args.warmup_seconds, work, replica_url)
        warm_at = samplers[0].samples[-1][0]
        measured = run_mix(url, seconds, work, replica_url)
        for thread in side:
            thread.finish()
        load_after = load_average()
        acknowledged = writes.check()
        replica = replica_figures(writes, follower[0], url) if follower else None
        for watcher in watchers:
            watcher.stop.set()
            watcher.join()
    five_xx = sum(
        count
        for route in measured.values()
        for status, count in route.get("statuses", {}).items()
        if status.startswith("5")
    )
    lifecycle, writer = lifecycles.report(), writes.report()
    five_xx += lifecycle["five_xx"] + writer["five_xx"]
    if replica is not None:
        replica |= {
            "rss_mb": rss_summary(samplers[1], warm_at),
            "replication": watch.report(),  # type: ignore[union-attr]
            "tracebacks_in_log": (work / "replica.log").read_text().count("Traceback"),
        }
    result = {
        "command": command(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "connections": sum(c for c, *_ in routes().values())
        + (sum(c for c, *_ in replica_routes().values()) if replica else 0),
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
        "acknowledged_writes_lost_on_replica": replica["acknowledged_check"]["lost"] if replica else None,
        "rss_mb": rss_summary(samplers[0], warm_at),
        "replica": replica,
        "tracebacks_in_server_log": (work / "server.log").read_text().count("Traceback"),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "machine": f"{os.cpu_count()} cores, shared with other work (see load averages)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    shown = {k: v for k, v in result.items() if k not in ("warmup_routes", "replica")}
    print(json.dumps(shown, indent=1)[:4000])


def replica_figures(writes: AcknowledgedWriter, replica: str, writer: str) -> dict:
    """Once the replica holds the writer's last sequence: every acknowledged write read back there too."""
    return {
        "converged_after_load_s": converged(writer, replica),
        "acknowledged_check": writes.check(replica),
    }


if __name__ == "__main__":
    main()
