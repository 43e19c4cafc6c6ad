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
shared with other work distorts less than wall-clock rates.

    apt-get install -y wrk
    .venv/bin/python benchmarks/http_throughput.py [--seconds 20] [--out benchmarks/results/http_throughput.json]

``--profile-seconds N`` adds one more ``/embed`` arm with py-spy sampling the server (it slows the server,
so that arm counts in no ratio) and records where the event loop's samples went (``loop_profile``).
py-spy samples wall-clock time: a thread that waits for a core or for the GIL outside a blocking call
still counts. ``--perf-seconds N`` adds an ``/embed`` arm under Linux ``perf`` (CPU-clock samples, so
only time on a core counts) and records, per thread, which library the CPU time was spent in
(``cpu_profile``: the interpreter, the tokenizer, libc's allocator, the kernel, uvloop, ONNX Runtime).
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
from collections import Counter
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


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU of each thread of a running process, by thread id (the main thread's id is ``pid``)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = stat_cpu_seconds(task / "stat")
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return out


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wrk(url: str, route: str, bodies: Path, connections: int, seconds: int, script: Path, pid: int) -> dict:
    server_cpu, wrk_cpu, threads = cpu_seconds(pid), children_cpu(), thread_cpu_seconds(pid)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script), url],
        env={**os.environ, "BODIES": str(bodies), "ROUTE": route},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    server_cpu, wrk_cpu = cpu_seconds(pid) - server_cpu, children_cpu() - wrk_cpu
    threads = {tid: seconds - threads.get(tid, 0.0) for tid, seconds in thread_cpu_seconds(pid).items()}
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    result["requests_per_s"] = result["requests"] / result["seconds"]
    result["server_cpu_us_per_request"] = server_cpu / result["requests"] * 1e6
    result["wrk_cpu_us_per_request"] = wrk_cpu / result["requests"] * 1e6
    # Where the server's time goes: the event loop runs on the main thread (HTTP, the lane, inline
    # tokenising, responses); the rest is the inference threads (and the tokenizer thread for long texts).
    loop_cpu = threads.get(pid, 0.0)
    result["server_cpu_us_per_request_by_thread"] = {
        "event_loop": loop_cpu / result["requests"] * 1e6,
        "other_threads": (sum(threads.values()) - loop_cpu) / result["requests"] * 1e6,
    }
    result["errors_total"] = sum(result["errors"].values())
    result["load"] = load_average()
    return result


# Parts of the event loop's time that do not nest in one another, by a frame on the sample's stack; the
# loop's own C code (uvloop: epoll, recv; httptools' parser) is the samples whose innermost Python frame is
# the loop's entry point, and the rest is Python: uvicorn's protocol, the lane, validation, the response.
LOOP_PARTS = {
    "tokenising": ("TextTokenizer.encode (",),
    "socket send, one per response": ("CoalescingTransport.flush (",),
    "access line": ("Logger.handle (",),
    "metrics": ("Counter.inc (", "Histogram.observe (", "Gauge.set ("),
}
LOOP_ENTRY = "Runner.run ("
LOOP_C, LOOP_PYTHON = "uvloop and httptools (C)", "other Python"


def function_name(frame: str) -> str:
    """``name (file.py:line)`` -> ``name (file.py)``: samples add up per function, not per line."""
    return frame.rsplit(":", 1)[0] + ")" if frame.endswith(")") and ":" in frame else frame


def loop_part(frames: list[str]) -> str:
    stack = ";".join(frames)
    for name, marks in LOOP_PARTS.items():
        if any(mark in stack for mark in marks):
            return name
    return LOOP_C if frames[-1].startswith(LOOP_ENTRY) else LOOP_PYTHON


def loop_profile(raw: Path, top: int = 15) -> dict:
    """Shares of the main thread's (the event loop's) py-spy samples: the parts above, and the functions the
    samples were in (self time)."""
    parts = Counter(dict.fromkeys([*LOOP_PARTS, LOOP_C, LOOP_PYTHON], 0))
    own: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *frames = stack.split(";")
        if "MainThread" in thread and frames:
            parts[loop_part(frames)] += int(count)
            own[function_name(frames[-1])] += int(count)
    total = parts.total()
    return {
        "samples": total,
        "parts": {name: round(n / total, 3) for name, n in parts.items()},
        "self": {name: round(n / total, 3) for name, n in own.most_common(top)},
    }


def profiled_arm(url: str, bodies: Path, script: Path, pid: int, seconds: int, work: Path) -> dict:
    """``POST /embed`` under wrk while py-spy samples the server for ``seconds`` (100 Hz, not pausing it)."""
    raw = work / "loop.raw"
    py_spy = Path(sys.executable).with_name("py-spy")
    sampler = subprocess.Popen(
        [str(py_spy), "record", "-p", str(pid), "-d", str(seconds), "-r", "100", "--nonblocking"]
        + ["--threads", "-f", "raw", "-o", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    arm = wrk(url, "/embed", bodies, CONNECTIONS, seconds + 2, script, pid)
    if sampler.wait(60) != 0 or not raw.is_file():
        raise SystemExit("py-spy failed: it needs ptrace rights over the server (the same user, or root)")
    return {"requests_per_s_while_sampled": arm["requests_per_s"], **loop_profile(raw)}


def embedding_passes(url: str) -> tuple[float, float]:
    """(texts, forward passes) the embedding batcher has run so far, from /metrics."""
    return batch_totals(httpx.get(url + "/metrics", timeout=30).text)


def batch_totals(text: str) -> tuple[float, float]:
    """(texts, passes) of the ``embed`` batcher in a Prometheus exposition (its batch-size histogram)."""
    totals = {}
    for part in ("sum", "count"):
        found = re.search(rf'^cloze_batch_size_{part}{{batcher="embed"}} (\S+)$', text, re.M)
        totals[part] = float(found.group(1)) if found else 0.0
    return totals["sum"], totals["count"]


def in_process_texts_per_pass(encoder, sentences: list[str]) -> float:
    """Texts per forward pass when the runtime plans all the sentences at once, as ``embed`` does."""
    from encoder_runtime.tokenization import plan_batches

    lengths = [len(item) for item in encoder.encode(sentences)]
    return len(lengths) / len(plan_batches(lengths, *encoder.batch_budget))


def perf_arm(url: str, bodies: Path, script: Path, pid: int, seconds: int, work: Path) -> dict:
    """``POST /embed`` under wrk while ``perf record`` samples the server's CPU clock for ``seconds``."""
    data = work / "perf.data"
    sampler = subprocess.Popen(
        ["perf", "record", "-e", "cpu-clock", "-F", "1999", "-p", str(pid), "-o", str(data)]
        + ["--", "sleep", str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    arm = wrk(url, "/embed", bodies, CONNECTIONS, seconds + 2, script, pid)
    if sampler.wait(120) != 0 or not data.is_file():
        raise SystemExit("perf record failed: it needs perf_event_paranoid <= 2 and rights over the server")
    samples = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "tid,ip,dso"], capture_output=True, text=True, check=True
    ).stdout
    return {"requests_per_s_while_sampled": arm["requests_per_s"], **cpu_profile(samples, pid)}


def cpu_profile(samples: str, pid: int) -> dict:
    """Shares of CPU-clock samples by library, for the event loop (the main thread) and for the rest."""
    by_thread: dict[str, Counter[str]] = {"event_loop": Counter(), "other_threads": Counter()}
    for line in samples.splitlines():
        tid, _ip, dso = (line.split(None, 2) + ["", ""])[:3]  # "  2847  7f69035e82 (/path/lib.so)"
        if not tid.isdigit():
            continue
        name = dso.strip("()").rsplit("/", 1)[-1].split(".cpython")[0] or "unknown"
        by_thread["event_loop" if int(tid) == pid else "other_threads"][name] += 1
    return {
        thread: {
            "samples": counts.total(),
            "share_by_library": {name: round(n / counts.total(), 3) for name, n in counts.most_common(10)},
        }
        for thread, counts in by_thread.items()
        if counts
    }


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
        f" {row['server_cpu_us_per_request']:.0f} (loop {row['server_cpu_us_per_request_by_thread']['event_loop']:.0f})"
        f" wrk {row['wrk_cpu_us_per_request']:.0f}  load {row['load']}"
        + (f"  {row['texts_per_pass']:.1f} texts a pass" if "texts_per_pass" in row else "")
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
    parser.add_argument(
        "--profile-seconds", type=int, default=0, help="then py-spy the event loop for this long (0: no)"
    )
    parser.add_argument(
        "--perf-seconds", type=int, default=0, help="then sample the server's CPU with perf this long (0: no)"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "http_throughput.json"))
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    if args.perf_seconds and shutil.which("perf") is None:
        raise SystemExit("perf not found: apt-get install -y linux-perf")

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
            texts, passes = embedding_passes(url)
            arms[route] = {
                "connections": CONNECTIONS,
                **wrk(url, route, bodies, CONNECTIONS, args.seconds, script, server.pid),
            }
            texts_after, passes_after = embedding_passes(url)
            arms[route]["texts_per_pass"] = (texts_after - texts) / (passes_after - passes)
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
        if args.profile_seconds:
            profile = profiled_arm(url, embed_bodies, script, server.pid, args.profile_seconds, work)
            print("event loop, share of py-spy samples:", profile["parts"])
        if args.perf_seconds:
            cpu = perf_arm(url, embed_bodies, script, server.pid, args.perf_seconds, work)
            print("event loop, share of CPU samples:", cpu["event_loop"]["share_by_library"])
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
        # the same sentences planned all at once, as the in-process arm runs them (each HTTP arm has its own)
        "in_process_texts_per_pass": in_process_texts_per_pass(encoder, sentences),
        "http": arms,
        "ratio_to_in_process": ratios,
        "cpu_time_ratio_to_in_process": cpu_ratios,
    }
    if args.profile_seconds:
        result["loop_profile"] = {"route": "/embed", "seconds": args.profile_seconds, **profile}
    if args.perf_seconds:
        result["cpu_profile"] = {"route": "/embed", "seconds": args.perf_seconds, **cpu}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
