"""The REST path against the runtime behind it, both arms in one run, on 2,000 distinct real sentences.

Arm 1, in-process: ``load_encoder(backend).embed(sentences)`` with the service's batch settings (the
offline rate the service should approach). Arm 2, HTTP: a real ``cloze serve`` on a loopback port, loaded
by Debian's ``wrk`` (compiled; a Python asyncio client saturates a core here near 170 requests/s and
measures itself) with a Lua script that cycles through one request body per sentence: ``POST /embed``
and ``POST /v1/embeddings``, one text a request, 64 connections. Then ``POST /search`` (hybrid, top 10)
with SciFact's real queries at 16 connections. The in-process arm runs right before and after each embedding
arm (the machine is shared: the mean of the two is that arm's reference; all are recorded with ``uptime``
load).

wrk, the server and the runtime share the machine's cores, as they would on a 2-core host. Each HTTP arm
also records the CPU time the server and wrk spent per request (from /proc and rusage), which a machine
shared with other work distorts less than wall-clock rates, and the CPU of its event-loop thread alone (the
per-request cost of the HTTP stack, which inference on other threads does not blur).

    apt-get install -y wrk
    .venv/bin/python benchmarks/http_throughput.py [--seconds 20] [--out benchmarks/results/http_throughput.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))
from harness.provenance import command, load_average  # noqa: E402

CONNECTIONS = 64
SEARCH_CONNECTIONS = 16

# wrk: each thread cycles through the bodies from its own offset; ``done`` prints one JSON line.
LUA = r"""
local bodies = {}
for line in io.lines(os.getenv("BODIES")) do bodies[#bodies + 1] = line end
local route = os.getenv("ROUTE")
local next_thread = 0
local counter = 0
local headers = {["Content-Type"] = "application/json"}
function setup(thread)
  thread:set("offset", next_thread * 997)
  next_thread = next_thread + 1
end
function init(args)
  counter = offset or 0
end
function request()
  counter = counter + 1
  return wrk.format("POST", route, headers, bodies[(counter % #bodies) + 1])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nRESULT {"requests": %d, "seconds": %.3f, "p50_ms": %.2f, "p90_ms": %.2f, "p99_ms": %.2f, ' ..
    '"max_ms": %.2f, "errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def distinct_sentences(limit: int) -> list[str]:
    """Half STS-B test sentences (short), half sentences from SciFact abstracts (longer), no repeats."""
    seen: dict[str, None] = {}
    for line in (SHARED / "stsbenchmark" / "sts-test.csv").read_text().splitlines():
        for text in line.split("\t")[5:7]:
            if len(seen) < limit // 2 and text.strip():
                seen.setdefault(text)
    with gzip.open(SHARED / "beir-scifact" / "corpus.jsonl.gz", "rt") as handle:
        for line in handle:
            for text in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]):
                if len(text.split()) >= 5 and len(seen) < limit:
                    seen.setdefault(text)
            if len(seen) >= limit:
                break
    return list(seen)


def scifact_queries() -> list[str]:
    with (SHARED / "beir-scifact" / "queries.jsonl").open() as handle:
        return [json.loads(line)["text"] for line in handle if line.strip()]


def offline_rate(encoder, sentences: list[str], repeats: int) -> dict:
    rates, cpu = [], []
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        encoder.embed(sentences)
        rates.append(len(sentences) / (time.perf_counter() - started))
        cpu.append((time.process_time() - cpu_started) / len(sentences) * 1e6)
    return {
        "sentences_per_s": float(np.median(rates)),
        "cpu_us_per_sentence": float(np.median(cpu)),
        "runs": rates,
        "load": load_average(),
    }


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU from a /proc ``stat`` file (a process's, or one thread's under ``task/``)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of every thread of a running process."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def loop_cpu_seconds(pid: int) -> float:
    """CPU of the server's main thread: its event loop (inference runs on threads of its own)."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/task/{pid}/stat"))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wrk(
    url: str,
    route: str,
    bodies: Path,
    connections: int,
    seconds: int,
    script: Path,
    pid: int,
    timeout: str = "10s",
) -> dict:
    server_cpu, wrk_cpu, loop_cpu = cpu_seconds(pid), children_cpu(), loop_cpu_seconds(pid)
    threads = min(2, connections)  # wrk needs a connection per thread
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        timeout,
        "-s",
        str(script),
    ]
    out = subprocess.run(
        [*argv, url],
        env={**os.environ, "BODIES": str(bodies), "ROUTE": route},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    server_cpu, wrk_cpu = cpu_seconds(pid) - server_cpu, children_cpu() - wrk_cpu
    loop_cpu = loop_cpu_seconds(pid) - loop_cpu
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    result["requests_per_s"] = result["requests"] / result["seconds"]
    result["server_cpu_us_per_request"] = server_cpu / result["requests"] * 1e6
    result["loop_cpu_us_per_request"] = loop_cpu / result["requests"] * 1e6
    result["wrk_cpu_us_per_request"] = wrk_cpu / result["requests"] * 1e6
    result["errors_total"] = sum(result["errors"].values())
    result["load"] = load_average()
    return result


def show(name: str, row: dict) -> None:
    if "sentences_per_s" in row:
        print(
            f"{name:16s}       {row['sentences_per_s']:7.0f} sentences/s, {row['cpu_us_per_sentence']:.0f} us CPU"
            f" each  load {row['load']}"
        )
        return
    print(
        f"{name:16s} c={row['connections']:<3d} {row['requests_per_s']:7.0f} req/s  p50 {row['p50_ms']:6.1f} ms"
        f"  p99 {row['p99_ms']:6.1f} ms  errors {row['errors_total']}  CPU us/request: server"
        f" {row['server_cpu_us_per_request']:.0f} (event loop {row['loop_cpu_us_per_request']:.0f})"
        f" wrk {row['wrk_cpu_us_per_request']:.0f}  load {row['load']}"
    )


def write_bodies(folder: Path, name: str, bodies: list[dict]) -> Path:
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(body) + "\n" for body in bodies))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--seconds", type=int, default=20, help="wrk duration per HTTP arm")
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--repeats", type=int, default=3, help="offline passes over the sentences, each time")
    parser.add_argument("--no-search", action="store_true", help="skip /search (no SciFact index build)")
    parser.add_argument(
        "--server-checkout",
        default=str(ROOT),
        help="serve from this checkout instead (e.g. main's, for a baseline beside this one's result)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "http_throughput.json"))
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")

    from app.settings import Settings
    from encoder_runtime import load_encoder
    from harness.servers import free_port, wait_until

    settings = Settings()
    load_at_start = load_average()
    sentences = distinct_sentences(args.sentences)
    assert len(set(sentences)) == len(sentences) == args.sentences
    encoder = load_encoder(
        backend=args.backend,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_size=settings.max_batch_size,
    )
    encoder.embed(sentences[:128])  # warm-up
    # One text a pass on both sides: --server-checkout may name a checkout from before int8 scales were
    # calibrated, where a text's int8 vector moved (cosine ~0.99) with whatever shared its pass.
    reference = np.concatenate([encoder.embed([text]) for text in sentences[:8]])
    work = Path(tempfile.mkdtemp(prefix="cloze-http-"))
    script = work / "cycle.lua"
    script.write_text(LUA)
    embed_bodies = write_bodies(work, "embed", [{"inputs": s} for s in sentences])
    openai_bodies = write_bodies(work, "openai", [{"input": s, "model": "x"} for s in sentences])
    index = work / "index"
    if not args.no_search:
        from benchmarks.search_latency import scifact_index

        index = scifact_index(args.backend)
    search_bodies = write_bodies(
        work, "search", [{"query": q, "mode": "hybrid", "top_k": 10} for q in scifact_queries()]
    )

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    checkout = str(Path(args.server_checkout).resolve())
    env = {**os.environ, "CLOZE_INDEX": str(index), "CLOZE_BACKEND": args.backend, "PYTHONPATH": checkout}
    log = work / "server.log"
    with log.open("w") as handle:
        server = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=checkout,
        )
    arms: dict[str, dict] = {}
    try:
        wait_until(url + "/readyz", server, log, 900)
        served = np.array(
            [
                httpx.post(url + "/embed", json={"inputs": text}, timeout=30).json()[0]
                for text in sentences[:8]
            ]
        )
        cosine = float((served * reference).sum(axis=1).min())
        assert cosine > 0.9999, f"the server runs another model or backend (cosine {cosine})"
        wrk(url, "/embed", embed_bodies, CONNECTIONS, 3, script, server.pid)  # warm-up
        # The in-process arm runs right before and right after each embedding arm (the server idles
        # meanwhile): the load other work puts on the machine drifts, and each ratio is taken against the
        # mean of its two neighbours.
        offline = [offline_rate(encoder, sentences, args.repeats)]
        show("in-process", offline[-1])
        for route, bodies in (("/embed", embed_bodies), ("/v1/embeddings", openai_bodies)):
            arms[route] = {
                "connections": CONNECTIONS,
                **wrk(url, route, bodies, CONNECTIONS, args.seconds, script, server.pid),
            }
            show(route, arms[route])
            offline.append(offline_rate(encoder, sentences, args.repeats))
            show("in-process", offline[-1])
            reference_rate = (offline[-2]["sentences_per_s"] + offline[-1]["sentences_per_s"]) / 2
            reference_cpu = (offline[-2]["cpu_us_per_sentence"] + offline[-1]["cpu_us_per_sentence"]) / 2
            arms[route]["in_process_sentences_per_s"] = reference_rate
            arms[route]["ratio_to_in_process"] = arms[route]["requests_per_s"] / reference_rate
            # Under load from other work the wall-clock ratio favours the HTTP arm (server and wrk threads
            # get a larger share of a contended CPU than the two in-process threads); CPU time per text
            # (server + wrk against the in-process arm's) does not, so it is recorded too.
            http_cpu = arms[route]["server_cpu_us_per_request"] + arms[route]["wrk_cpu_us_per_request"]
            arms[route]["cpu_time_ratio_to_in_process"] = reference_cpu / http_cpu
        if not args.no_search:
            arms["/search"] = {
                "connections": SEARCH_CONNECTIONS,
                "body": "hybrid, top_k 10, SciFact's queries",
                **wrk(url, "/search", search_bodies, SEARCH_CONNECTIONS, args.seconds, script, server.pid),
            }
            show("/search", arms["/search"])
    finally:
        server.terminate()
        server.wait(60)
    ratios = {route: arms[route]["ratio_to_in_process"] for route in ("/embed", "/v1/embeddings")}
    cpu_ratios = {
        route: arms[route]["cpu_time_ratio_to_in_process"] for route in ("/embed", "/v1/embeddings")
    }
    for route, ratio in ratios.items():
        print(f"{route}: {ratio:.2f}x the in-process rate; {cpu_ratios[route]:.2f}x its CPU time per text")
    result = {
        "command": command(),
        "backend": args.backend,
        "server_checkout": subprocess.run(
            ["git", "-C", checkout, "log", "-1", "--format=%h %s"], capture_output=True, text=True
        ).stdout.strip(),
        "sentences": len(sentences),
        "mean_words": float(np.mean([len(s.split()) for s in sentences])),
        "machine": {"cpus": os.cpu_count()},
        "load_generator": f"wrk -t2, {CONNECTIONS} connections, {args.seconds} s per arm, loopback",
        "server_log_level": settings.log_level,
        "load_at_start": load_at_start,
        "load_at_end": load_average(),
        "note": "load averages over the machine's 2 cores: above 2, other work shared the CPU during this run",
        "in_process": offline,
        "http": arms,
        "ratio_to_in_process": ratios,
        "cpu_time_ratio_to_in_process": cpu_ratios,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
