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

``--compare-layout BEFORE`` measures instead the service on the GPU's pass layout (``CLOZE_TORCH_PASSES=cuda``:
one pass at a time on torch's threads, the GPU's budgets) served from the checkout BEFORE and from this one, in
turn in one run: server CPU per request against the in-process CPU per text of this checkout's runtime, one
text a request and 256 texts a request, p50/p99, and a py-spy profile of each server under the one-text load
(``--profile-seconds``). benchmarks/gpu.py runs the same comparison on a GPU (``compare_layouts``):

    git archive <before> | (mkdir -p runs/before && tar -x -C runs/before)
    .venv/bin/python benchmarks/http_throughput.py --compare-layout runs/before --thin --seconds 12 \
        --out benchmarks/results/http_cuda_layout.json

``--thin`` serves a stand-in for the bundled encoder 32 units wide (its tokenizer, pooling and the same torch
calls a pass, each next to free): on a CPU the passes' arithmetic would otherwise hide what the host does
around them, which is what a GPU leaves to it.
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
    result["server_cpu_s"] = server_cpu
    done = result["requests"]  # none answered in time: no figure per request
    result["server_cpu_us_per_request"] = server_cpu / done * 1e6 if done else None
    result["loop_cpu_us_per_request"] = loop_cpu / done * 1e6 if done else None
    result["wrk_cpu_us_per_request"] = wrk_cpu / done * 1e6 if done else None
    result["errors_total"] = sum(result["errors"].values())
    result["load"] = load_average()
    return result


def profile_summary(raw: Path, top: int = 15) -> dict:
    """py-spy's raw output (``stack;frames count`` lines) as the frames with the most samples, by thread:
    on their own (self) and with what they call (inclusive)."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, samples = stack.split(";"), int(count)
        total += samples
        root = next((f for f in frames if "_infer" in f or "Runner.run" in f or "_tokenize" in f), frames[0])
        threads[root] = threads.get(root, 0) + samples
        own[frames[-1]] = own.get(frames[-1], 0) + samples
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + samples

    def ranked(counts: dict[str, int]) -> list[list]:
        return [[frame, n] for frame, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    return {
        "samples": total,
        "by_thread": ranked(threads),
        "self": ranked(own),
        "inclusive": ranked(inclusive),
    }


def profiled_wrk(args: tuple, pid: int, seconds: int, raw: Path) -> tuple[dict, dict | None]:
    """``wrk(*args)`` with py-spy recording the server meanwhile (when py-spy is installed)."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return wrk(*args), None
    recorder = subprocess.Popen(
        [spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "50", "--nonblocking", "--format", "raw",
         "-o", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    result = wrk(*args)
    recorder.wait(seconds + 30)
    return result, profile_summary(raw) if raw.is_file() else None


def compare_layouts(
    checkouts: dict[str, Path],
    sentences: list[str],
    env: dict[str, str],
    seconds: int,
    connections: dict[int, int],
    profile_seconds: int,
    work: Path,
) -> dict:
    """Each checkout's ``cloze serve`` in turn under wrk: per request shape (texts a request -> connections)
    throughput, p50/p99, errors and server CPU per request and per text; the one-text arm profiled."""
    from harness.servers import serve_process

    script = work / "cycle.lua"
    script.write_text(LUA)
    shapes = {1: [{"inputs": s} for s in sentences]}
    shapes[256] = [{"inputs": sentences[i : i + 256]} for i in range(0, len(sentences) - 255, 256)]
    bodies = {n: write_bodies(work, f"embed{n}", rows) for n, rows in shapes.items()}
    out: dict = {}
    for name, checkout in checkouts.items():
        # the checkout first, then what else this process was given (carried packages, a model package)
        others = [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT
        ]
        path = os.pathsep.join([str(checkout), *others])
        server_env = {**env, "CLOZE_INDEX": str(work / f"index-{name}"), "PYTHONPATH": path}
        arms: dict = {}
        with serve_process(server_env, work / f"{name}.log", timeout=600, checkout=checkout) as (url, server):
            for n, path in bodies.items():
                args = (url, "/embed", path, connections[n], seconds, script, server.pid, "10s")
                wrk(url, "/embed", path, connections[n], 3, script, server.pid, "10s")  # warm-up
                embedded = embedded_texts(url)
                if n == 1 and profile_seconds:
                    arm, profile = profiled_wrk(args, server.pid, profile_seconds, work / f"{name}.raw")
                    arm["profile"] = profile
                else:
                    arm = wrk(*args)
                arm["texts_embedded"] = embedded_texts(url) - embedded
                arm["server_cpu_us_per_text_embedded"] = (
                    arm["server_cpu_s"] / max(arm["texts_embedded"], 1) * 1e6
                )
                arm["connections"] = connections[n]
                arm["texts_per_s"] = arm["requests_per_s"] * n
                per_request = arm["server_cpu_us_per_request"]
                arm["server_cpu_us_per_text"] = per_request / n if per_request is not None else None
                arms[f"{n} text{'s' if n > 1 else ''} a request"] = arm
                print(
                    f"{name:>6} {n:>3} a request, c={connections[n]}: {arm['texts_per_s']:7.0f} texts/s  p50"
                    f" {arm['p50_ms']:7.1f} ms  p99 {arm['p99_ms']:7.1f} ms  errors {arm['errors_total']}"
                    f"  server CPU {arm['server_cpu_s']:.1f} s, {arm['server_cpu_us_per_text_embedded']:.0f} us a text"
                    " embedded",
                    flush=True,
                )
        out[name] = {"checkout": git_head(checkout), "arms": arms}
    return out


# 64 requests of 256 texts (random lengths of 8-60 tokens) queued at once through a checkout's MicroBatcher,
# each pass 2 ms of sleep (a device's time: no host CPU), so the queue stays deep as 64 connections of 256
# texts keep it on a GPU: the CPU spent is the queue's own (planning each pass, answering).
QUEUE_COST = """
import asyncio, json, random, sys, time
from encoder_runtime.batcher import MicroBatcher
from encoder_runtime.tokenization import Encoded
size, padding = int(sys.argv[1]), int(sys.argv[2])
random.seed(0)
passes = []
def encode(texts):
    return [Encoded((1,) * int(text), False) for text in texts]
def run(items):
    passes.append(len(items))
    time.sleep(0.002)
    return [0] * len(items)
async def main():
    batcher = MicroBatcher(encode, run, max_batch_tokens=8192, max_batch_size=size, max_queue=10**6,
                           max_padding=0.1, padding_tokens=padding, inline_chars=10**9)
    requests = [[str(random.randint(8, 60)) for _ in range(256)] for _ in range(64)]
    started = time.process_time()
    await asyncio.gather(*(batcher.submit(texts) for texts in requests))
    spent = time.process_time() - started
    await batcher.stop()
    print(json.dumps({"texts": sum(passes), "passes": len(passes), "cpu_us_per_text": spent / sum(passes) * 1e6}))
asyncio.run(main())
"""


def queue_cost(checkout: Path, size: int, padding: int) -> dict:
    """CPU a text spends in ``checkout``'s batcher with 16,384 texts queued, passes free (``QUEUE_COST``)."""
    done = subprocess.run(
        [sys.executable, "-c", QUEUE_COST, str(size), str(padding)],
        env={**os.environ, "PYTHONPATH": str(checkout)},
        cwd=checkout,  # ``-c`` puts the working directory first on the path
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        "max_batch_size": size,
        "padding_tokens": padding,
        **json.loads(done.stdout.strip().splitlines()[-1]),
    }


def embedded_texts(url: str) -> float:
    """Texts the server's embedding batcher has run through passes (``/metrics``): what CPU is divided by when
    requests time out and per-request figures count only the few that finished."""
    text = httpx.get(url + "/metrics", timeout=30).text
    line = next(
        line for line in text.splitlines() if line.startswith('cloze_batch_size_sum{batcher="embed"}')
    )
    return float(line.rsplit(" ", 1)[1])


def git_head(checkout: Path) -> str:
    head = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h %s"], capture_output=True, text=True
    )
    return head.stdout.strip() or str(checkout)


def layout_main(args) -> None:
    """``--compare-layout``: the GPU's pass layout on this machine, the checkout BEFORE against this one."""
    from encoder_runtime import load_encoder
    from encoder_runtime.backends.torch_backend import LAYOUT_VARIABLE

    os.environ[LAYOUT_VARIABLE] = "cuda"
    sentences = distinct_sentences(args.sentences)
    work = Path(tempfile.mkdtemp(prefix="cloze-layout-"))
    env = {"CLOZE_BACKEND": "torch", LAYOUT_VARIABLE: "cuda", "CLOZE_MAX_QUEUE": "40000"}
    model = None
    if args.thin:  # the host's work around the passes, which is what a GPU leaves to the CPU
        from encoder_runtime.model_dir import bundled_model_path
        from harness.tiny_model import make_thin_encoder

        model = make_thin_encoder(work / "thin", bundled_model_path())
        env["CLOZE_MODEL"] = str(model)
    encoder = load_encoder(model, backend="torch")
    encoder.embed(sentences[:128])  # warm-up
    in_process = offline_rate(encoder, sentences, args.repeats)
    show("in-process", in_process)
    checkouts = {"before": Path(args.compare_layout).resolve(), "after": ROOT}
    connections = {1: CONNECTIONS, 256: args.many_connections}
    # each checkout's batcher as its GPU layout shapes it: before 64 texts a pass in length buckets
    queued = {"before": queue_cost(checkouts["before"], 64, 0), "after": queue_cost(ROOT, 1024, 4096)}
    print(f"queue of 16,384 texts: {json.dumps(queued)}", flush=True)
    served = compare_layouts(checkouts, sentences, env, args.seconds, connections, args.profile_seconds, work)
    result = {
        "command": command(),
        "what": "cloze serve on the GPU's pass layout (CLOZE_TORCH_PASSES=cuda) on this CPU: before and after",
        "model": "the bundled encoder 32 units wide (harness.tiny_model.make_thin_encoder): its tokenizer, "
        "pooling and torch calls a pass, each next to free, as a GPU's passes look from its host"
        if args.thin
        else "the bundled encoder",
        "machine": {"cpus": os.cpu_count()},
        "sentences": len(sentences),
        "server_env": env,
        "load_generator": f"wrk -t2, {args.seconds} s an arm, loopback, connections per shape {connections}",
        "in_process": in_process,
        "queue_of_16384_texts": queued,
        "served": served,
        "load_at_end": load_average(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out}")


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
    parser.add_argument("--compare-layout", metavar="BEFORE", help="checkout to compare on the GPU's layout")
    parser.add_argument("--many-connections", type=int, default=8, help="connections of 256 texts a request")
    parser.add_argument(
        "--profile-seconds", type=int, default=10, help="py-spy under the one-text load; 0: none"
    )
    parser.add_argument(
        "--thin", action="store_true", help="--compare-layout with a thin stand-in for the bundled encoder"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    if args.compare_layout:
        layout_main(args)
        return

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
