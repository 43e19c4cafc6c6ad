"""Replication's targets on loopback: a moto S3 server, a writer and two replicas (`cloze serve` with the
bundled model, ONNX int8), over an index of ``--passages`` prose passages built offline first.

Measured: how long after a write is acknowledged it is readable on every replica (p50/p99/max); the
writer's upsert latency with replication off, in local mode and in remote mode, interleaved request by
request; a fresh replica's time to ready (process start included) and its base copy alone; a replica
killed with SIGKILL while writes go on: restart to converged.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/replication.py --passages 20000 \
        --out benchmarks/results/replication.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.index_scale import write_corpus  # noqa: E402
from harness.crashes import AUTH, Chain, Server, wait_ready  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from harness.replication import MotoServer, replication_env  # noqa: E402
from harness.tiny_model import make_tiny_bert  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BUNDLED = {"CLOZE_MODEL": "", "CLOZE_BACKEND": "auto"}


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "n": len(values),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * pick(0.99), 1),
        "max_ms": round(1000 * ordered[-1], 1),
    }


def build_index(root: Path, passages: int) -> float:
    from encoder_runtime import load_encoder
    from index.builder import BuildOptions, build_from_input

    corpus = root.parent / "corpus.jsonl.gz"
    write_corpus(corpus, passages, (1, 2))
    started = time.perf_counter()
    build_from_input(root, corpus, load_encoder(), BuildOptions(show_progress=False))
    return time.perf_counter() - started


def state(server: Server) -> dict:
    answer = httpx.get(server.url + "/readyz", headers=AUTH, timeout=10).json()
    return answer.get("collections", {}).get("default", {}).get("replication") or {}


def wait_converged(writer: Server, replicas: list[Server], timeout: float = 300) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        goal = state(writer)
        states = [state(r) for r in replicas]
        if all(s.get("version") == goal["version"] and s.get("applied_seq") == goal["seq"] for s in states):
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"no convergence in {timeout}s")


def upsert(server: Server, docs: list[dict], ack: str | None = None) -> float:
    started = time.perf_counter()
    answer = httpx.put(
        server.url + "/documents", params={"ack": ack} if ack else None, json=docs, headers=AUTH, timeout=60
    )
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - started


def visibility(chain: Chain, writer: Server, replicas: list[Server], writes: int) -> dict:
    """Each write acknowledged (local mode), then every replica polled until it reads the document."""
    delays = []
    with httpx.Client(headers=AUTH, timeout=10) as http:
        for _ in range(writes):
            doc = chain.new_docs(1)
            upsert(writer, doc)
            acked = time.perf_counter()
            for replica in replicas:
                while http.get(f"{replica.url}/documents/{doc[0]['id']}").status_code != 200:
                    time.sleep(0.01)
            delays.append(time.perf_counter() - acked)
    return percentiles(delays)


def upsert_latency(chain: Chain, plain: Server, writer: Server, rounds: int) -> dict:
    """Replication off (another process on a copy of the index), local and remote mode: interleaved."""
    times: dict[str, list[float]] = {"off": [], "local": [], "remote": []}
    for _ in range(rounds):
        times["off"].append(upsert(plain, chain.new_docs(5)))
        times["local"].append(upsert(writer, chain.new_docs(5), "local"))
        times["remote"].append(upsert(writer, chain.new_docs(5), "remote"))
    return {mode: percentiles(values) for mode, values in times.items()}


def base_copy_seconds(log: Path) -> float | None:
    found = re.findall(r"copied base \S+ in ([0-9.]+) s", log.read_text(errors="replace"))
    return float(found[-1]) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=20000)
    parser.add_argument("--writes", type=int, default=200, help="writes whose visibility is timed")
    parser.add_argument("--rounds", type=int, default=100, help="upserts per mode for the latency")
    parser.add_argument("--work", type=Path, default=None, help="keep the built index here between runs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/replication.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="cloze-replication-"))
    built = work / "built"
    build_s = None
    if not (built / "CURRENT").exists():
        built.mkdir(parents=True, exist_ok=True)
        build_s = build_index(built, args.passages)
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    shutil.copytree(built, run / "writer")
    shutil.copytree(built, run / "plain")
    moto = MotoServer(run / "moto.log")
    chain = Chain(root=run / "writer", model=make_tiny_bert(run / "tiny"), work=run)
    servers: list[Server] = []
    result: dict = {"passages": args.passages, "build_seconds": build_s}
    try:
        plain = chain.spawn("plain", {**BUNDLED, "CLOZE_INDEX": str(run / "plain")})
        started = time.monotonic()
        writer = chain.start("writer", {**BUNDLED, **replication_env("writer", moto.url)})
        servers += [plain, writer]
        while (
            not moto.client()
            .list_objects_v2(Bucket="cloze-replicas", Prefix="loopback/default/CURRENT.json")
            .get("KeyCount")
        ):
            time.sleep(0.1)
        result["writer_first_base_shipped_s"] = round(time.monotonic() - started, 2)
        wait_ready(plain)
        replicas = []
        for number in range(2):
            env = {
                **BUNDLED,
                "CLOZE_INDEX": str(run / f"replica{number}"),
                **replication_env("replica", moto.url),
            }
            started = time.monotonic()
            replicas.append(chain.spawn(f"replica{number}", env))
            servers.append(replicas[-1])
            wait_ready(replicas[-1])
            wait_converged(writer, replicas[-1:])
            result[f"fresh_replica{number}_ready_s"] = round(time.monotonic() - started, 2)
            result[f"fresh_replica{number}_base_copy_s"] = base_copy_seconds(replicas[-1].log)
        result["visible_on_every_replica"] = visibility(chain, writer, replicas, args.writes)
        result["writer_upsert_5_docs"] = upsert_latency(chain, plain, writer, args.rounds)
        victim = replicas[0]
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        for _ in range(50):
            upsert(writer, chain.new_docs(5))
        started = time.monotonic()
        env = {**BUNDLED, "CLOZE_INDEX": str(run / "replica0"), **replication_env("replica", moto.url)}
        replicas[0] = chain.spawn("replica0-restarted", env)
        servers.append(replicas[0])
        wait_ready(replicas[0])
        ready = time.monotonic() - started
        wait_converged(writer, replicas)
        result["killed_replica"] = {
            "writes_while_down": 50,
            "restart_to_ready_s": round(ready, 2),
            "restart_to_converged_s": round(time.monotonic() - started, 2),
        }
        result["documents_at_end"] = httpx.get(writer.url + "/index/fields", headers=AUTH).json()["counts"]
    finally:
        for server in servers:
            server.kill()
        moto.stop()
    result |= {
        "command": command(),
        "load_average": load_average(),
        "model": "bundled all-MiniLM-L6-v2, ONNX int8",
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
