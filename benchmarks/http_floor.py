"""What the event loop spends on a request beyond uvicorn's own floor: ``POST /embed`` against a raw app.

Four servers in one run, each loaded by wrk exactly as ``benchmarks/http_throughput.py`` loads ``/embed``
(64 connections, one real sentence a request): the real ``cloze serve`` (ONNX int8); uvicorn with the
service's own protocol class (``HeaderTimeoutProtocol``, ``CoalescingTransport``) in front of a raw ASGI
app that reads the body and answers one fixed ``/embed``-sized body, with no model, and the same raw app
with each answer held for the real server's time in flight, so that it serves at the real rate; and the
real service with each forward pass slept for as long as a real pass of its shape takes
(``SLEPT_SERVER``). For each: requests a second and CPU time a request on the event-loop thread and the
others (/proc), then the loop thread's system calls a request counted by ``strace -c`` over a second wrk
run (strace slows the server, so that run counts in no rate). Issue 22 asks where the loop's time goes;
this says how much of it uvicorn itself costs, how much sharing the cores with ONNX Runtime adds, and how
differently the servers use the kernel.

    apt-get install -y wrk strace
    .venv/bin/python benchmarks/http_floor.py [--seconds 10] [--out benchmarks/results/http_floor.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.http_throughput import (  # noqa: E402
    CONNECTIONS,
    LUA,
    distinct_sentences,
    write_bodies,
    wrk,
)
from benchmarks.provenance import command, load_average  # noqa: E402

# The raw server: uvicorn as ``cloze serve`` runs it (its protocol class, no access log), one fixed answer;
# with a delay (``floor_server.py DELAY PORT``) each answer waits that long first, so the raw app serves at
# the real server's rate and latency: its loop then turns, and wakes wrk, about as often a request.
FLOOR_SERVER = r"""
import asyncio
import sys

import numpy as np
import orjson
import uvicorn

from app.service.server import HeaderTimeoutProtocol

vector = np.random.default_rng(0).standard_normal((1, 384)).astype("float32")
BODY = orjson.dumps(vector / np.linalg.norm(vector), option=orjson.OPT_SERIALIZE_NUMPY)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    if DELAY:
        await asyncio.sleep(DELAY)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


DELAY = float(sys.argv[1]) if len(sys.argv) > 2 else 0.0
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[-1]), log_config=None, access_log=False,
            http=HeaderTimeoutProtocol, lifespan="off")
"""


# The real service with every forward pass slept instead of run: each pass sleeps the wall time a real pass
# of its shape takes (fitted on its first pass on this machine, fixed cost plus cost a padded token) and answers
# ones of the real output's shape, so requests arrive and leave at about the real rate while ONNX Runtime
# leaves both cores to the event loop. Its loop CPU a request, beside the real server's, says how much of
# the loop's cost comes from sharing the two cores with the inference threads.
SLEPT_SERVER = r"""
import sys
import threading
import time

import numpy as np

from encoder_runtime.backends.onnx_backend import OnnxBackend

real_pass = OnnxBackend.__call__
fitted = {}
fitting = threading.Lock()  # the first passes of both inference threads arrive together


def pass_seconds(backend, rows, width):
    with fitting:
        if not fitted:
            fitted.update(fit(backend))
            print("slept passes:", fitted, flush=True)
    return fitted["fixed"] + fitted["per_token"] * rows * width


def fit(backend):  # a real pass's wall time as fixed cost plus cost a padded token, from two shapes
    timings = []
    for shape in ((1, 16), (8, 32)):
        ids = np.ones(shape, dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)}
        out = real_pass(backend, inputs)
        started = time.perf_counter()
        for _ in range(20):
            real_pass(backend, inputs)
        timings.append(((time.perf_counter() - started) / 20, shape[0] * shape[1]))
    (small, small_tokens), (large, large_tokens) = timings
    per_token = (large - small) / (large_tokens - small_tokens)
    fixed = small - per_token * small_tokens
    # keeps_width: the graph answers token vectors (pooled later), not one vector a row
    return {"per_token": per_token, "fixed": fixed, "keeps_width": out.ndim == 3, "dim": out.shape[-1]}


def slept_pass(self, inputs):
    rows, width = inputs["input_ids"].shape
    time.sleep(pass_seconds(self, rows, width))
    shape = (rows, width, fitted["dim"]) if fitted["keeps_width"] else (rows, fitted["dim"])
    return np.ones(shape, dtype=np.float32)


OnnxBackend.__call__ = slept_pass
from app.cli import main

main(["serve", "--host", "127.0.0.1", "--port", sys.argv[1]])
"""


def cpu_arm(pid: int, url: str, bodies: Path, script: Path, seconds: int) -> dict:
    arm = wrk(url, "/embed", bodies, CONNECTIONS, seconds, script, pid)
    if arm["errors_total"]:
        raise SystemExit(f"wrk saw errors: {arm['errors']}")
    by_thread = arm["server_cpu_us_per_request_by_thread"]
    return {
        "requests_per_s": round(arm["requests_per_s"], 1),
        "p99_ms": arm["p99_ms"],
        "event_loop_cpu_us_per_request": round(by_thread["event_loop"], 1),
        "other_threads_cpu_us_per_request": round(by_thread["other_threads"], 1),
    }


def syscall_arm(pid: int, url: str, bodies: Path, script: Path, seconds: int, work: Path) -> dict:
    """The event-loop thread's system calls a request (strace -c on that thread alone)."""
    counts = work / f"strace-{pid}.txt"
    tracer = subprocess.Popen(["strace", "-c", "-p", str(pid), "-o", str(counts)], stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached
    requests = wrk(url, "/embed", bodies, CONNECTIONS, seconds, script, pid)["requests"]
    tracer.terminate()
    tracer.wait(30)
    calls = {}
    for line in counts.read_text().splitlines():
        fields = line.split()  # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(fields) >= 5 and fields[3].isdigit() and fields[-1].isidentifier() and fields[-1] != "total":
            calls[fields[-1]] = int(fields[3])
    per_request = {name: round(n / requests, 2) for name, n in sorted(calls.items(), key=lambda kv: -kv[1])}
    return {
        "traced_requests": requests,
        "syscalls_per_request": round(sum(calls.values()) / requests, 2),
        "by_call": dict(list(per_request.items())[:8]),
    }


def measure_server(
    name: str, argv: list[str], env: dict, work: Path, bodies: Path, script: Path, seconds: int
) -> dict:
    """Start one server (its port appended to ``argv``), warm it, then its CPU arm and its system-call arm."""
    from harness.servers import free_port, wait_until

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / "server.log"
    with log.open("w") as handle:
        server = subprocess.Popen(
            [*argv, str(port)],
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(url + ("/readyz" if env else "/"), server, log, 600)
        wrk(url, "/embed", bodies, CONNECTIONS, 3, script, server.pid)  # warm-up
        row = cpu_arm(server.pid, url, bodies, script, seconds)
        row |= syscall_arm(server.pid, url, bodies, script, seconds, work)
    finally:
        server.terminate()
        server.wait(60)
    print(name, json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="wrk duration of each arm")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "http_floor.json")
    args = parser.parse_args()
    for tool in ("wrk", "strace"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install -y {tool}")

    work = Path(tempfile.mkdtemp(prefix="cloze-http-floor-"))
    script = work / "cycle.lua"
    script.write_text(LUA)
    bodies = write_bodies(work, "embed", [{"inputs": s} for s in distinct_sentences(2000)])
    (work / "floor_server.py").write_text(FLOOR_SERVER)
    (work / "slept_server.py").write_text(SLEPT_SERVER)
    service_env = {"CLOZE_BACKEND": "onnx-int8", "CLOZE_INDEX": str(work / "no-index")}
    servers = {
        "raw app (uvicorn floor)": ([sys.executable, str(work / "floor_server.py")], {}),
        "cloze serve /embed": (
            [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port"],
            service_env,
        ),
        "cloze serve /embed, passes slept": ([sys.executable, str(work / "slept_server.py")], service_env),
    }
    result: dict = {"command": command(), "load_at_start": load_average(), "servers": {}}
    for name, (argv, env) in servers.items():
        result["servers"][name] = measure_server(name, argv, env, work, bodies, script, args.seconds)
    # the raw app again, each answer held for the real server's mean time in flight (Little's law)
    delay = CONNECTIONS / result["servers"]["cloze serve /embed"]["requests_per_s"]
    result["servers"]["raw app, answers delayed"] = measure_server(
        "raw app, answers delayed", [sys.executable, str(work / "floor_server.py"), f"{delay:.4f}"], {},
        work, bodies, script, args.seconds,
    )  # fmt: skip
    result["servers"]["raw app, answers delayed"]["delay_ms"] = round(1000 * delay, 1)
    floor, real, slept, delayed = (row["event_loop_cpu_us_per_request"] for row in result["servers"].values())
    result["event_loop_cpu_over_floor"] = round(real / floor, 2)
    result["event_loop_cpu_over_delayed_floor"] = round(real / delayed, 2)
    result["event_loop_cpu_real_over_slept_passes"] = round(real / slept, 2)
    result["load_at_end"] = load_average()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
