"""Replication's targets on loopback: a moto S3 server, a writer and two replicas (`cloze serve` with the
bundled model, ONNX int8), over an index of ``--passages`` prose passages built offline first.

Measured: how long after a write is acknowledged it is readable on every replica (p50/p99/max); the
writer's upsert latency with replication off, in local mode and in remote mode, interleaved request by
request (with ``--baseline-checkout``, also a writer running another checkout's code, for a before/after in
one run); a fresh replica's time to ready (process start included) and where it went (the stages its log
stamps: the process serving, the embedding and fill-mask models loaded, the base downloaded, its verified
restore); a replica killed with SIGKILL while writes go on: restart to converged. With ``--large-passages``,
a fresh replica of that larger index too (its own bucket and writer; the index built once and kept in
``--large-work``).

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/replication.py --passages 10000 \
        --large-passages 100000 --out benchmarks/results/replication.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
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
from harness.replication import BUCKET, MotoServer, replication_env  # noqa: E402
from harness.servers import free_port  # noqa: E402
from harness.tiny_model import make_tiny_bert  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BUNDLED = {"CLOZE_MODEL": "", "CLOZE_BACKEND": "auto"}
STAGES = {  # a replica's log lines that mark where its seconds to ready went
    "serving": "Started server process",
    "embedding_model_loaded": "embedding model",
    "fill_mask_model_loaded": "fill-mask model",
    "base_copied": "copied base",
}
COPIED = re.compile(r"copied base \S+ in ([0-9.]+) s \(download ([0-9.]+) s, verified restore ([0-9.]+) s\)")


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
    from index.build.builder import BuildOptions, build_from_input

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


def upsert_latency(
    chain: Chain, plain: Server, writer: Server, rounds: int, baseline: Server | None = None
) -> dict:
    """Replication off (another process on a copy of the index), local and remote mode: interleaved; with a
    ``baseline`` writer (another checkout's code), its local and remote mode in the same rounds."""
    writers = {"": writer} | ({"baseline_": baseline} if baseline else {})
    times: dict[str, list[float]] = {"off": []}
    for _ in range(rounds):
        times["off"].append(upsert(plain, chain.new_docs(5)))
        for prefix, server in writers.items():
            for mode in ("local", "remote"):
                times.setdefault(prefix + mode, []).append(upsert(server, chain.new_docs(5), mode))
    return {mode: percentiles(values) for mode, values in times.items()}


def base_copy_seconds(log: Path) -> float | None:
    found = COPIED.findall(log.read_text(errors="replace"))
    return float(found[-1][0]) if found else None


def stages(log: Path, spawned: float) -> dict:
    """Seconds from the spawn to each stage the replica's log stamps, and its base copy's two parts."""
    found: dict = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        for name, text in STAGES.items():
            if name not in found and text in str(entry.get("msg", "")):
                found[name] = round(entry["ts"] - spawned, 2)
    if copied := COPIED.findall(log.read_text(errors="replace")):
        found["base_download_s"], found["base_verified_restore_s"] = map(float, copied[-1][1:])
    return found


def spawn_from(chain: Chain, name: str, checkout: Path, extra: dict) -> Server:
    """`cloze serve` running ``checkout``'s code (Chain.spawn runs this one's)."""
    port, log = free_port(), chain.work / f"{name}.log"
    env = chain.env(extra, name) | {"PYTHONPATH": str(checkout)}
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=checkout,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    return Server(process, f"http://127.0.0.1:{port}", log, chain.work / "x", chain.work / "y")


def wait_shipped(moto: MotoServer) -> None:
    client = moto.client()
    while not client.list_objects_v2(Bucket=BUCKET, Prefix="loopback/default/CURRENT.json").get("KeyCount"):
        time.sleep(0.1)


def fresh_replica(
    chain: Chain, writer: Server, moto: MotoServer, name: str, folder: Path
) -> tuple[Server, dict]:
    """A replica started on an empty folder: seconds to ready, to converged, and the stages between."""
    env = {**BUNDLED, "CLOZE_INDEX": str(folder), **replication_env("replica", moto.url)}
    spawned, started = time.time(), time.monotonic()
    replica = chain.spawn(name, env)
    wait_ready(replica, timeout=600)
    ready = time.monotonic() - started
    wait_converged(writer, [replica])
    figures = {"ready_s": round(ready, 2), "converged_s": round(time.monotonic() - started, 2)}
    return replica, figures | {"stages_s": stages(replica.log, spawned)}


def prepared(work: Path, passages: int) -> tuple[Path, float | None]:
    """``work``/run, emptied, with the index of ``work``/built copied in as ``writer`` (built first if it is
    not there yet: its build's seconds, else None)."""
    built, build_s = work / "built", None
    if not (built / "CURRENT").exists():
        built.mkdir(parents=True, exist_ok=True)
        build_s = build_index(built, passages)
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    shutil.copytree(built, run / "writer")
    return run, build_s


def large_fresh_replica(passages: int, work: Path) -> dict:
    """A writer of ``passages`` ships its base to a bucket of its own; a fresh replica copies it."""
    run, build_s = prepared(work, passages)
    moto = MotoServer(run / "moto.log")
    chain = Chain(root=run / "writer", model=make_tiny_bert(run / "tiny"), work=run)
    servers: list[Server] = []
    try:
        started = time.monotonic()
        servers.append(chain.start("writer", {**BUNDLED, **replication_env("writer", moto.url)}))
        wait_shipped(moto)
        shipped = time.monotonic() - started
        replica, figures = fresh_replica(chain, servers[0], moto, "replica", run / "replica")
        servers.append(replica)
        listing = moto.client().list_objects_v2(Bucket=BUCKET, Prefix="loopback/default/e")["Contents"]
        base_mb = sum(item["Size"] for item in listing if item["Key"].endswith(".tar")) / 2**20
    finally:
        for server in servers:
            server.kill()
        moto.stop()
    return {
        "passages": passages,
        "build_seconds": build_s,
        "writer_first_base_shipped_s": round(shipped, 2),
        "base_mb": round(base_mb, 1),
        **figures,
    }


def killed_replica(chain: Chain, writer: Server, replicas: list[Server], env: dict, servers: list) -> dict:
    """Replica 0 killed with SIGKILL, 50 writes, then started again on its folder (added to ``servers``)."""
    replicas[0].process.send_signal(signal.SIGKILL)
    replicas[0].process.wait()
    for _ in range(50):
        upsert(writer, chain.new_docs(5))
    spawned, started = time.time(), time.monotonic()
    replicas[0] = chain.spawn("replica0-restarted", env)
    servers.append(replicas[0])
    wait_ready(replicas[0])
    ready = time.monotonic() - started
    wait_converged(writer, replicas)
    return {
        "writes_while_down": 50,
        "restart_to_ready_s": round(ready, 2),
        "restart_to_converged_s": round(time.monotonic() - started, 2),
        "stages_s": stages(replicas[0].log, spawned),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=10000)
    parser.add_argument("--writes", type=int, default=200, help="writes whose visibility is timed")
    parser.add_argument("--rounds", type=int, default=100, help="upserts per mode for the latency")
    parser.add_argument("--work", type=Path, default=None, help="keep the built index here between runs")
    parser.add_argument("--large-passages", type=int, default=0, help="a fresh replica of this many too")
    parser.add_argument("--large-work", type=Path, default=None, help="keep that index here between runs")
    parser.add_argument("--baseline-checkout", type=Path, default=None, help="a writer of this code too")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/replication.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="cloze-replication-"))
    run, build_s = prepared(work, args.passages)
    shutil.copytree(run / "writer", run / "plain")
    moto = MotoServer(run / "moto.log")
    chain = Chain(root=run / "writer", model=make_tiny_bert(run / "tiny"), work=run)
    servers: list[Server] = []
    motos = [moto]
    result: dict = {"passages": args.passages, "build_seconds": build_s}
    try:
        plain = chain.spawn("plain", {**BUNDLED, "CLOZE_INDEX": str(run / "plain")})
        started = time.monotonic()
        writer = chain.start("writer", {**BUNDLED, **replication_env("writer", moto.url)})
        servers += [plain, writer]
        wait_shipped(moto)
        result["writer_first_base_shipped_s"] = round(time.monotonic() - started, 2)
        baseline = None
        if args.baseline_checkout:
            shutil.copytree(run / "writer", run / "baseline")
            motos.append(MotoServer(run / "moto-baseline.log"))
            env = {**BUNDLED, "CLOZE_INDEX": str(run / "baseline"), **replication_env("writer", motos[1].url)}
            baseline = spawn_from(chain, "baseline", args.baseline_checkout.resolve(), env)
            servers.append(baseline)
            wait_ready(baseline)
            wait_shipped(motos[1])
        wait_ready(plain)
        replicas = []
        for number in range(2):
            replica, figures = fresh_replica(
                chain, writer, moto, f"replica{number}", run / f"replica{number}"
            )
            replicas.append(replica)
            servers.append(replica)
            result[f"fresh_replica{number}_ready_s"] = figures["converged_s"]
            result[f"fresh_replica{number}_base_copy_s"] = base_copy_seconds(replica.log)
            result[f"fresh_replica{number}_stages_s"] = figures["stages_s"]
        result["visible_on_every_replica"] = visibility(chain, writer, replicas, args.writes)
        result["writer_upsert_5_docs"] = upsert_latency(chain, plain, writer, args.rounds, baseline)
        if baseline:
            result["baseline_checkout"] = str(args.baseline_checkout)
        env = {**BUNDLED, "CLOZE_INDEX": str(run / "replica0"), **replication_env("replica", moto.url)}
        result["killed_replica"] = killed_replica(chain, writer, replicas, env, servers)
        result["documents_at_end"] = httpx.get(writer.url + "/index/fields", headers=AUTH).json()["counts"]
    finally:
        for server in servers:
            server.kill()
        for bucket in motos:
            bucket.stop()
    if args.large_passages:
        large_work = args.large_work or work / f"large-{args.large_passages}"
        result["fresh_large_replica"] = large_fresh_replica(args.large_passages, large_work)
    result |= {
        "command": command(),
        "load_average": load_average(),
        "model": "bundled all-MiniLM-L6-v2, ONNX int8",
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
