"""What tracing costs on the HTTP path: a checkout from before it (tracing off), this one with it off, this one
exporting every span over OTLP/HTTP, and this one exporting one request in ten, measured in turn in one run, in
rounds (ABCD ABCD ...), so each arm meets the same machine.

Each arm is a real ``cloze serve`` (ONNX Runtime int8) over one index of SciFact abstracts, loaded by Debian's
``wrk`` on loopback: ``POST /search`` (hybrid, top 10, SciFact's queries; every instrumented step runs) at 16
connections, then ``POST /embed`` (one sentence a request: the embedding lane and the batcher) at 64. Figures:
requests/s, p50/p99 and the server's CPU per request (from /proc: a machine shared with other work distorts it
less than rates). The exporting arms send to an OTLP endpoint in this process that accepts and drops (it counts
the export requests, so the spans are known to have left).

    .venv/bin/python benchmarks/tracing_cost.py --before <commit> [--rounds 3] [--seconds 6] \
        [--out benchmarks/results/tracing_cost.json]

``--before`` is a commit of this repository from before tracing; it is served from a ``git archive`` of it.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import timeit
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.http_throughput import (  # noqa: E402
    LUA,
    SHARED,
    distinct_sentences,
    scifact_queries,
    write_bodies,
    wrk,
)
from harness.provenance import command, load_average  # noqa: E402
from harness.servers import serve_process  # noqa: E402

ROUTES = {"/search": 16, "/embed": 64}  # route -> wrk connections
WARM_UP_S = 2
SAMPLER = "parentbased_traceidratio"


class DroppingSink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that reads each export, counts it and answers 200; the bodies are kept, undecoded,
    to count spans per request after the run (``spans_per_request``), not while the arms run."""

    received = {"requests": 0, "bytes": 0}
    bodies: list[bytes] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
        size = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(size)
        with self.lock:
            self.received["requests"] += 1
            self.received["bytes"] += size
            self.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:  # quiet: one line per export otherwise
        pass


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), DroppingSink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def spans_per_request(bodies: list[bytes]) -> dict:
    """From the exported spans: per route, the median number of spans in a request's trace, all of them and
    those the service opens (FastAPI's server and ``fastapi.*`` spans left out): with tracing off, each of the
    service's is at most one no-op ``child_span`` call (``off_path``)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    traces: dict[bytes, list] = {}
    for body in bodies:
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    traces.setdefault(span.trace_id, []).append(span)
    out: dict[str, dict] = {}
    for spans in traces.values():
        root = next((s for s in spans if s.kind == Span.SPAN_KIND_SERVER), None)
        if root is None or root.name not in (f"POST {route}" for route in ROUTES):
            continue  # a trace cut by an export still in flight at the end
        own = [s for s in spans if s.kind != Span.SPAN_KIND_SERVER and not s.name.startswith("fastapi.")]
        row = out.setdefault(root.name, {"traces": 0, "spans": [], "service_spans": [], "names": set()})
        row["traces"] += 1
        row["spans"].append(len(spans))
        row["service_spans"].append(len(own))
        row["names"].update(s.name for s in own)
    return {
        name: {
            "traces": row["traces"],
            "spans_median": median(row["spans"]),
            "service_spans_median": median(row["service_spans"]),
            "service_span_names": sorted(row["names"]),
        }
        for name, row in out.items()
    }


def off_path() -> dict:
    """In this process, tracing off (no provider): one instrumented step as the index writes it (a span
    opened with an attribute, another set after), and the bare check a pool or the batcher makes."""
    from opentelemetry import trace

    from encoder_runtime.tracing import child_span, recording

    tracer = trace.get_tracer(__name__)

    def step() -> None:
        with child_span(tracer, "index.dense", {"cloze.search.depth": 30}) as span:
            span.set_attribute("cloze.candidates", 10)

    calls = 200_000
    best = {
        name: min(timeit.repeat(f, number=calls, repeat=5)) / calls * 1e9
        for name, f in (("step", step), ("check", recording))
    }
    return {"step_ns": round(best["step"]), "check_ns": round(best["check"]), "load": load_average()}


def build_index(folder: Path, documents: int) -> Path:
    """SciFact's first ``documents`` abstracts, built once with this checkout's ``cloze index build`` (the index
    format is the before checkout's too) and opened by every arm in turn."""
    corpus = folder / "corpus.jsonl"
    with gzip.open(SHARED / "beir-scifact" / "corpus.jsonl.gz", "rt") as handle, corpus.open("w") as out:
        for _, line in zip(range(documents), handle, strict=False):
            row = json.loads(line)
            out.write(json.dumps({"id": row["_id"], "text": f"{row['title']}. {row['text']}"}) + "\n")
    index = folder / "index"
    subprocess.run(
        [sys.executable, "-m", "app.cli", "index", "build", "--input", str(corpus), "--out", str(index)],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CLOZE_BACKEND": "onnx-int8"},
        check=True,
        capture_output=True,
    )
    return index


def archive(revision: str, folder: Path) -> Path:
    """The tree of ``revision`` (a commit of this repository), to serve from."""
    folder.mkdir()
    tree = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=tree, check=True)
    return folder


def git_head(checkout: Path, revision: str = "HEAD") -> str:
    shown = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h %s", revision], capture_output=True, text=True
    )
    return shown.stdout.strip()


def measure_arm(
    checkout: Path, env: dict[str, str], bodies: dict[str, Path], seconds: int, work: Path
) -> dict:
    """One server from ``checkout`` under each route's load in turn (a short warm-up first)."""
    script = work / "cycle.lua"
    path = os.pathsep.join(
        [str(checkout), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    server_env = {**env, "PYTHONPATH": path}
    out = {}
    with serve_process(server_env, work / "server.log", timeout=600, checkout=checkout) as (url, server):
        for route, connections in ROUTES.items():
            wrk(url, route, bodies[route], connections, WARM_UP_S, script, server.pid)
            out[route] = wrk(url, route, bodies[route], connections, seconds, script, server.pid)
    return out


def summary(runs: list[dict]) -> dict:
    """Per route: each round's figures and their medians."""
    out = {}
    for route in ROUTES:
        rows = [run[route] for run in runs]
        out[route] = {
            "requests_per_s": [round(r["requests_per_s"], 1) for r in rows],
            "p50_ms": [r["p50_ms"] for r in rows],
            "p99_ms": [r["p99_ms"] for r in rows],
            "server_cpu_us_per_request": [round(r["server_cpu_us_per_request"], 1) for r in rows],
            "errors": [r["errors_total"] for r in rows],
            "load": [r["load"] for r in rows],
            "median": {
                key: round(median(r[key] for r in rows), 2)
                for key in ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_request")
            },
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", required=True, help="a commit from before tracing (served from its archive)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=6, help="wrk duration per route per arm")
    parser.add_argument("--documents", type=int, default=500, help="SciFact abstracts in the index")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tracing_cost.json"))
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    load_at_start = load_average()
    work = Path(tempfile.mkdtemp(prefix="cloze-tracing-"))
    (work / "cycle.lua").write_text(LUA)
    bodies = {
        "/search": write_bodies(
            work, "search", [{"query": q, "mode": "hybrid", "top_k": 10} for q in scifact_queries()]
        ),
        "/embed": write_bodies(work, "embed", [{"inputs": s} for s in distinct_sentences(2000)]),
    }
    index = build_index(work, args.documents)
    base = {"CLOZE_INDEX": str(index), "CLOZE_BACKEND": "onnx-int8"}
    before = archive(args.before, work / "before")
    runs: dict[str, list[dict]] = {"before_off": [], "after_off": [], "after_on": [], "after_sampled": []}
    with otlp_sink() as endpoint:
        exporting = base | {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "tracing-cost"}
        arms = {
            "before_off": (before, base),
            "after_off": (ROOT, base),
            "after_on": (ROOT, exporting),
            # What docs/deployment.md advises under load: one request in ten traced (an unsampled one takes the
            # off path below FastAPI's span).
            "after_sampled": (
                ROOT,
                exporting | {"OTEL_TRACES_SAMPLER": SAMPLER, "OTEL_TRACES_SAMPLER_ARG": "0.1"},
            ),
        }
        for round_number in range(args.rounds):
            for name, (checkout, env) in arms.items():
                runs[name].append(measure_arm(checkout, env, bodies, args.seconds, work))
                medians = {r: runs[name][-1][r]["requests_per_s"] for r in ROUTES}
                print(
                    f"round {round_number + 1} {name:>10}: {json.dumps(medians)} load {load_average()}",
                    flush=True,
                )
        exported = dict(DroppingSink.received)
    spans = spans_per_request(DroppingSink.bodies)
    off = off_path()
    for row in spans.values():  # what the off path adds to a request, at most: one step per span
        row["off_path_us_at_most"] = round(row["service_spans_median"] * off["step_ns"] / 1000, 2)
    result = {
        "command": command(),
        "what": "the HTTP path's cost of tracing: before (no tracing), after with it off, after exporting every "
        "span over OTLP/HTTP to a local endpoint that drops them, after exporting one request in ten "
        f"({SAMPLER} 0.1); arms in turn, in rounds",
        "before": git_head(ROOT, args.before),
        "after": git_head(ROOT),
        "machine": {"cpus": os.cpu_count()},
        "index": f"{args.documents} SciFact abstracts, ONNX Runtime int8 (CLOZE_BACKEND=onnx-int8)",
        "load_generator": f"wrk -t2 on loopback, {args.seconds} s a route an arm after {WARM_UP_S} s of warm-up; "
        f"connections {ROUTES}",
        "bodies": {"/search": "SciFact queries, mode hybrid, top_k 10", "/embed": "one sentence a request"},
        "otlp_exports_received": exported,
        "spans_per_request": spans,
        "off_path_in_process": off,
        "arms": {name: summary(rows) for name, rows in runs.items()},
        "load_at_start": load_at_start,
        "load_at_end": load_average(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
