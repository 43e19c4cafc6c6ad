"""Infinity's public CPU workload, run side by side on this machine: requests of 256 real sentences each.

Infinity's benchmark page reports one workload, a fixed number of requests of 256 sentences each, as seconds and
tokens/s per backend. This script times that workload here in one run, so a user can read our rows against
theirs in the format they already compare by:

- cloze-search: ``cloze serve`` with CLOZE_BACKEND=torch, onnx and onnx-int8, ``POST /embed`` (TEI's shape);
- Infinity: ``infinity_emb v2`` from its own virtual environment, REST ``POST /embeddings``, its torch engine
  and its optimum (ONNX Runtime) engine on the CPU, loading the same bundled all-MiniLM-L6-v2 from a local
  folder (HF_HUB_OFFLINE=1, nothing from a hub); a row says "not installed" when the executable is absent;
- sentence-transformers in-process: ``model.encode`` of the same 256-sentence batches, no server.

Requests go one at a time (as Infinity's page does); then, unless ``--concurrency 1``, the servers again with
that many requests in flight (``concurrent_rows``). All servers run at once and the rows take turns request by
request, the order rotating each round: the machine is shared, and load that comes and goes then falls on every
row alike. Each arm answers warm-up requests first, and its first answer is compared with sentence-transformers
(cosine), so every row computes the same embeddings. Tokens are
counted once with the model's tokenizer (special tokens included; no sentence is over the 256-token window, so
nothing is truncated) and the same count divides every row's seconds. The client runs on the same cores as the
servers and only reads each timed answer's bytes; a server's own defaults are kept (cloze: batches of at most
64 sequences; Infinity: --batch-size 32; sentence-transformers: encode's batch_size 32).

Infinity is installed apart from the project, in a venv of its own (``python3 -m venv ../infinity-venv``,
``pip install torch==2.13.0`` first, then ``pip install "infinity-emb[server,torch,optimum]==0.0.78"``), named
by ``--infinity``. The optimum engine loads ``model.onnx`` from the model folder: the script exports it once
with that venv's ``optimum-cli``.

The default workload, 16 requests of 256 sentences per row at concurrency 1 and again at 4, takes about ten
minutes on this machine's 2 shared cores (servers' start and warm-up included):

    .venv/bin/python benchmarks/compare_infinity.py --infinity ../infinity-venv/bin/infinity_emb \
        [--requests 16] [--concurrency 1,4] [--out benchmarks/results/infinity_comparison.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.data import SHARED_DATA  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from harness.servers import free_port, serve_process, wait_until  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length
CLOZE_BACKENDS = ("torch", "onnx", "onnx-int8")
INFINITY_ENGINES = ("torch", "optimum")
SENTENCES_FROM = (
    "STS Benchmark test sentences (both sides, sts-test.csv) and the first sentence of each BEIR SciFact abstract, "
    "deduplicated, those over 256 tokens left out, shuffled with seed 0; request i takes the next 256"
)


def sentence_pool(tokenizer) -> list[str]:
    """Short everyday sentences and long technical ones, mixed so that every request carries both."""
    sts = []
    for line in (SHARED_DATA / "stsbenchmark" / "sts-test.csv").read_text().splitlines():
        sts += line.split("\t")[5:7]
    scifact = []
    with gzip.open(SHARED_DATA / "beir-scifact" / "corpus.jsonl.gz", "rt") as handle:
        for line in handle:
            first = re.split(r"(?<=[.!?])\s+", json.loads(line)["text"].strip(), maxsplit=1)[0]
            scifact.append(first)
    pool = [s for s in dict.fromkeys(s.strip() for s in sts + scifact) if s]
    lengths = [len(e.ids) for e in tokenizer.encode_batch(pool)]
    pool = [s for s, n in zip(pool, lengths, strict=True) if n <= MAX_TOKENS]
    random.Random(0).shuffle(pool)
    return pool


def workload(pool: list[str], requests: int, size: int) -> list[list[str]]:
    """Consecutive slices of the pool; cycles through it when the workload is larger than the pool."""
    return [[pool[(i * size + j) % len(pool)] for j in range(size)] for i in range(requests)]


def summary(seconds: float, latencies: list[float], sentences: int, tokens: int) -> dict:
    ms = sorted(x * 1000 for x in latencies)
    return {
        "seconds": round(seconds, 2),
        "sentences_per_s": round(sentences / seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1),
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
    }


def cosines(vectors: np.ndarray, reference: np.ndarray) -> np.ndarray:
    a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


class Arm:
    """One row: how to embed a batch (checked once against sentence-transformers), how to send one for timing,
    and the seconds and latencies it has gathered per concurrency."""

    def __init__(self, engine: str, backend: str, versions: str, embed, send, concurrent: bool = True):
        self.engine, self.backend, self.versions = engine, backend, versions
        self.embed, self.send, self.concurrent = embed, send, concurrent
        self.seconds: dict[int, float] = {}
        self.latencies: dict[int, list[float]] = {}
        self.cosine = {"mean": 1.0, "min": 1.0}

    def run(self, chunk: list[list[str]], pool: ThreadPoolExecutor | None, concurrency: int) -> None:
        """Send one chunk (`concurrency` requests, all in flight at once) and add its wall time."""
        latencies = self.latencies.setdefault(concurrency, [])

        def one(batch: list[str]) -> None:
            started = time.perf_counter()
            self.send(batch)
            latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        if pool is None:
            for batch in chunk:
                one(batch)
        else:
            list(pool.map(one, chunk))
        self.seconds[concurrency] = self.seconds.get(concurrency, 0.0) + time.perf_counter() - started


def http_arm(engine: str, backend: str, versions: str, url: str, route: str, body, read) -> Arm:
    """A server's route; each thread keeps its own keep-alive connection, and a timed answer is only read."""
    clients: dict[int, httpx.Client] = {}

    def client() -> httpx.Client:
        thread = threading.get_ident()
        if thread not in clients:
            clients[thread] = httpx.Client(timeout=600)
        return clients[thread]

    def embed(batch: list[str]) -> np.ndarray:
        answer = client().post(url + route, json=body(batch))
        answer.raise_for_status()
        return np.asarray(read(answer.json()), dtype=np.float32)

    def send(batch: list[str]) -> None:
        answer = client().post(url + route, json=body(batch))
        if answer.status_code != 200 or not answer.content:
            raise RuntimeError(f"{engine} {backend}: {answer.status_code} {answer.text[:300]}")

    return Arm(engine, backend, versions, embed, send)


def git_commit() -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    return "unknown"


def versions(*names: str) -> str:
    found = []
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name} {metadata.version(name)}")
    return ", ".join(found)


def cloze_arms(stack: contextlib.ExitStack, work: Path) -> list[Arm]:
    arms = []
    for backend in CLOZE_BACKENDS:
        print(f"starting cloze-search {backend}", flush=True)
        env = {
            "CLOZE_BACKEND": backend,
            "CLOZE_INDEX": str(work / f"index-{backend}"),
            "PYTHONPATH": str(ROOT),
        }
        url, _ = stack.enter_context(serve_process(env, work / f"cloze-{backend}.log"))
        runtime = "torch" if backend == "torch" else "onnxruntime"
        version = f"cloze-search {git_commit()}, {versions(runtime)}"
        arms.append(
            http_arm("cloze-search", backend, version, url, "/embed", lambda b: {"inputs": b}, lambda a: a)
        )
    return arms


def infinity_model_dir(model_dir: Path, venv_bin: Path, work: Path) -> Path:
    """The bundled model's files linked into a folder of Infinity's own, plus ``model.onnx`` for its optimum
    engine, exported once by that venv's optimum-cli (the bundled ``onnx/`` folder holds this project's
    exports, whose outputs are pooled, not the ``last_hidden_state`` that Infinity pools itself)."""
    folder = work / "infinity-model"
    folder.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name != "onnx" and not (folder / item.name).exists():
            (folder / item.name).symlink_to(item)
    cli = venv_bin / "optimum-cli"
    if not (folder / "model.onnx").exists() and cli.exists():
        export = work / "infinity-onnx-export"
        shutil.rmtree(export, ignore_errors=True)
        subprocess.run(
            [str(cli), "export", "onnx", "--model", str(folder), "--task", "feature-extraction"]
            + ["--library-name", "transformers", str(export)],
            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf-home")},
            check=True,
            capture_output=True,
        )
        shutil.copy(export / "model.onnx", folder / "model.onnx")
    return folder


@contextlib.contextmanager
def infinity_process(executable: Path, folder: Path, engine: str, log_path: Path) -> Iterator[str]:
    """``infinity_emb v2`` on a free loopback port. It runs inside the model folder with ``--model-id .``:
    Infinity 0.0.78 hands optimum an absolute file name for a local folder, which optimum-onnx 0.1 no longer
    finds, and a relative one it does."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(executable), "v2", "--model-id", ".", "--served-model-name", "minilm", "--engine", engine]
    args += ["--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--pooling-method", "mean"]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(log_path.parent / "hf-home"),
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }
    env.pop("PYTHONPATH", None)
    with log_path.open("w") as log:
        process = subprocess.Popen(args, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(url + "/health", process, log_path, timeout=300)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def infinity_versions(venv_bin: Path) -> str:
    code = (
        "from importlib import metadata as m\n"
        "names = ['infinity-emb', 'torch', 'sentence-transformers', 'transformers', 'optimum', 'onnxruntime']\n"
        "out = []\n"
        "for n in names:\n"
        "    try: out.append(f'{n} {m.version(n)}')\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(', '.join(out))"
    )
    python = venv_bin / "python"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True).stdout.strip()


def infinity_arms(stack: contextlib.ExitStack, model_dir: Path, executable: Path, work: Path):
    """Arms for Infinity's engines, and (backend, status) for those that are not installed or did not start."""
    names = {"torch": "torch", "optimum": "optimum (onnxruntime)"}
    if not executable.exists():
        return [], [(names[engine], "not installed") for engine in INFINITY_ENGINES]
    venv_bin = executable.parent
    folder = infinity_model_dir(model_dir, venv_bin, work)
    version = infinity_versions(venv_bin)
    arms, missing = [], []
    for engine in INFINITY_ENGINES:
        if engine == "optimum" and not (folder / "model.onnx").exists():
            missing.append((names[engine], "not installed (no optimum-cli to export model.onnx)"))
            continue
        print(f"starting infinity {engine}", flush=True)
        try:
            url = stack.enter_context(
                infinity_process(executable, folder, engine, work / f"infinity-{engine}.log")
            )
        except Exception as error:  # one engine failing leaves the other rows standing
            missing.append((names[engine], f"failed: {str(error)[-300:]}"))
            continue
        body = lambda b: {"model": "minilm", "input": b}  # noqa: E731
        read = lambda a: [item["embedding"] for item in a["data"]]  # noqa: E731
        arms.append(http_arm("infinity", names[engine], version, url, "/embeddings", body, read))
    return arms, missing


def interleaved(arms: list[Arm], batches: list[list[str]], concurrency: int) -> None:
    """Every arm sends the same chunk of `concurrency` requests before any moves on, the order rotating each
    round: the machine is shared, and load that comes and goes then falls on every row alike."""
    pools = {id(arm): ThreadPoolExecutor(concurrency) if concurrency > 1 else None for arm in arms}
    for round_, start in enumerate(range(0, len(batches), concurrency)):
        chunk = batches[start : start + concurrency]
        shift = round_ % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            arm.run(chunk, pools[id(arm)], concurrency)
        print(f"  concurrency {concurrency}: {start + len(chunk)}/{len(batches)} requests", flush=True)
    for pool in pools.values():
        if pool is not None:
            pool.shutdown()


NOTES = [
    "rows: one request at a time, as Infinity's benchmark page; concurrent_rows: the servers again with several "
    "requests in flight (the concurrency key), sent in chunks of that many; sentence-transformers is in-process "
    "and has no concurrent row",
    "all servers run at once and the arms take turns request by request (chunk by chunk), the order rotating "
    "each round, so the load of other work on this shared machine falls on every row alike; an idle server "
    "waits while another answers",
    "tokens counted once with the model's tokenizer (special tokens included, no sentence truncated); the same "
    "count divides every row's seconds",
    "the load generator (Python httpx, in this process) shares the cores with the servers; it reads each timed "
    "answer's bytes without parsing them; JSON encoding of 256 x 384 floats is part of every server's time",
    "Infinity 0.0.78 with optimum 2.1 / optimum-onnx 0.1: its graph optimisation fails (OptimizationConfig has "
    "no optimize_with_onnxruntime_only), so the optimum engine serves the unoptimised fp32 model.onnx that "
    "optimum-cli exported; --pooling-method mean is passed because the optimum engine's 'auto' pools the CLS token",
    "each server keeps its own batching defaults: cloze max_batch_size 64 (CLOZE_MAX_BATCH_SIZE), Infinity "
    "--batch-size 32, sentence-transformers encode batch_size 32",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--sentences-per-request", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=3, help="Untimed requests per arm first")
    parser.add_argument("--concurrency", default="1,4", help="Requests in flight, comma-separated; 1 first")
    parser.add_argument("--infinity", default="/tmp/infinity-venv/bin/infinity_emb")
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=0.98,
        help="Least mean cosine to sentence-transformers (int8: ~0.99)",
    )
    parser.add_argument("--engines", default="sentence-transformers,cloze-search,infinity", help="Which rows")
    parser.add_argument(
        "--work", default="/tmp/cloze-infinity-compare", help="Logs, indexes, Infinity's folder"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "infinity_comparison.json"))
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    engines = args.engines.split(",")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from encoder_runtime.model_dir import bundled_model_path

    model_dir = Path(bundled_model_path())
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    pool = sentence_pool(tokenizer)
    batches = workload(pool, args.requests, args.sentences_per_request)
    sentences = sum(map(len, batches))
    tokens = sum(len(e.ids) for batch in batches for e in tokenizer.encode_batch(batch))
    print(f"{len(batches)} requests x {args.sentences_per_request} sentences, {tokens} tokens", flush=True)

    model = SentenceTransformer(str(model_dir), device="cpu")
    reference = model.encode(batches[0])
    rows, concurrent_rows, missing_rows = [], [], []
    empty = dict.fromkeys(("seconds", "sentences_per_s", "tokens_per_s", "p50_ms", "p99_ms"))
    with contextlib.ExitStack() as stack:
        arms: list[Arm] = []
        if "sentence-transformers" in engines:
            st_versions = versions("sentence-transformers", "torch", "transformers")
            backend = "torch (in-process encode, batch_size 32)"
            arms.append(Arm("sentence-transformers", backend, st_versions, model.encode, model.encode, False))
        if "cloze-search" in engines:
            arms += cloze_arms(stack, work)
        if "infinity" in engines:
            infinity, missing = infinity_arms(stack, model_dir, Path(args.infinity), work)
            arms += infinity
            for backend, status in missing:
                missing_rows.append(
                    {"engine": "infinity", "backend": backend, **empty, "versions": status, "status": status}
                )
        for arm in arms:  # warm-up; the first answer must be the same embeddings as sentence-transformers'
            cosine = cosines(arm.embed(batches[0]), reference)
            arm.cosine = {"mean": round(float(cosine.mean()), 4), "min": round(float(cosine.min()), 4)}
            if cosine.mean() < args.min_cosine:
                raise RuntimeError(
                    f"{arm.engine} {arm.backend}: embeddings differ from sentence-transformers: {arm.cosine}"
                )
            for batch in batches[1 : args.warmup]:
                arm.send(batch)
        load_before = load_average()
        for concurrency in levels:
            interleaved([a for a in arms if concurrency == 1 or a.concurrent], batches, concurrency)
        load_after = load_average()
    for arm in arms:
        for concurrency, seconds in arm.seconds.items():
            row = {
                "engine": arm.engine,
                "backend": arm.backend,
                **summary(seconds, arm.latencies[concurrency], sentences, tokens),
                "versions": arm.versions,
                "cosine_to_sentence_transformers": arm.cosine,
            }
            if concurrency == 1:
                rows.append(row)
            else:
                concurrent_rows.append({**row, "concurrency": concurrency})

    result = {
        "command": command(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "workload": {
            "requests": args.requests,
            "sentences_per_request": args.sentences_per_request,
            "sentences": SENTENCES_FROM,
            "tokens": tokens,
            "distinct_sentences": min(sentences, len(pool)),
            "warmup_requests": args.warmup,
            "concurrency": levels,
        },
        "machine": {
            "cores": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "rows": rows + missing_rows,
        "concurrent_rows": concurrent_rows,
        "notes": NOTES,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for row in rows + concurrent_rows:
        print(
            f"{row['engine']:22} {row['backend']:42} c={row.get('concurrency', 1)} {row['seconds']} s "
            f"{row['sentences_per_s']} sent/s {row['tokens_per_s']} tok/s p50 {row['p50_ms']} ms"
        )


if __name__ == "__main__":
    main()
