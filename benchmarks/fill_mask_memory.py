"""Peak RSS of one fill-mask pass of 16 texts x 64 masks (1,024 masks, the default admission limit) with
the shipped model: the MLM head at mask positions only (``FillMaskRuntime.run``, this project's path) vs
logits at every position (what the backend returned before), on torch and ONNX Runtime.

    python benchmarks/fill_mask_memory.py --out benchmarks/results/fill_mask_memory.json

Each measurement is a fresh process (``ru_maxrss`` is a lifetime peak).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import command  # noqa: E402


def measure(backend: str, mode: str) -> dict:
    from encoder_runtime import load_fill_mask

    runtime = load_fill_mask(backend=backend)
    text = "the " + " and ".join(["[MASK]"] * 64) + " ."
    items = runtime.encode([text] * 16)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    if mode == "mask rows only":
        runtime.run(items)
    else:
        logits = runtime.backend(runtime.tokenizer.pad(items))
        [
            logits[row, [i for i, t in enumerate(item.ids) if t == runtime.mask_id]]
            for row, item in enumerate(items)
        ]
    return {
        "backend": backend,
        "mode": mode,
        "tokens": sum(len(item) for item in items),
        "rss_before_mb": round(before),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "seconds": round(time.perf_counter() - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/fill_mask_memory.json"))
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one)))
        return
    rows = []
    for backend in ("torch", "onnx"):
        for mode in ("mask rows only", "every position"):
            out = subprocess.run(
                [sys.executable, __file__, "--one", backend, mode],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
            ).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1])
    result = {
        "command": command(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
