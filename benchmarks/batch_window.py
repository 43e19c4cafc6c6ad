"""Does the served queue batch worse than the offline plan? Forward-pass CPU per sentence, both ways.

Offline, ``EncoderRuntime.embed`` plans passes over all its texts at once (sorted by length: full, barely
padded passes). Served, the micro-batcher plans each pass over what is queued at that moment: at 64
connections, one sentence a request, at most a few dozen texts. This replays that queue: the texts in a
shuffled order, a window of ``W`` queued at a time, each pass the oldest queued text and those nearest its
length, taken by the service's own ``oldest_pass`` under its budget, the
window refilled after every pass. Every plan runs on this thread, interleaved with the others, several
times; the cost is this thread's CPU time per sentence (tokenising excluded), so the comparison holds
on a machine shared with other work better than wall-clock rates would.

    python benchmarks/batch_window.py [--backend onnx-int8] [--windows 16 32 48 64] [--repeats 5]

Writes ``benchmarks/results/batch_window.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.settings import Settings  # noqa: E402
from benchmarks.http_throughput import distinct_sentences  # noqa: E402
from benchmarks.provenance import command, load_average  # noqa: E402
from encoder_runtime import load_encoder  # noqa: E402
from encoder_runtime.batcher import oldest_pass  # noqa: E402
from encoder_runtime.tokenization import plan_batches  # noqa: E402


def queue_plan(lengths: list[int], window: int, budget: tuple, seed: int = 0) -> list[list[int]]:
    """The passes a queue of at most ``window`` texts makes, arrivals in a shuffled order."""
    arrivals = list(range(len(lengths)))
    random.Random(seed).shuffle(arrivals)
    queued: deque[int] = deque()
    passes, arrived = [], 0
    while arrived < len(arrivals) or queued:
        while len(queued) < window and arrived < len(arrivals):
            queued.append(arrivals[arrived])
            arrived += 1
        live = list(queued)
        taken = oldest_pass([lengths[i] for i in live], *budget)  # as the service takes it
        chosen = {live[i] for i in taken}
        passes.append(sorted(chosen))
        queued = deque(i for i in live if i not in chosen)
    return passes


def cpu_us_per_sentence(encoder, items: list, passes: list[list[int]]) -> float:
    started = time.thread_time()
    for batch in passes:
        encoder.run([items[i] for i in batch])
    return (time.thread_time() - started) / sum(map(len, passes)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 32, 48, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "batch_window.json")
    args = parser.parse_args()

    settings = Settings()
    encoder = load_encoder(
        backend=args.backend,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_size=settings.max_batch_size,
    )
    budget = encoder.batch_budget
    items = encoder.encode(distinct_sentences(args.sentences))
    lengths = [len(item) for item in items]
    plans = {"offline": plan_batches(lengths, *budget)}
    plans.update({f"queue of {w}": queue_plan(lengths, w, budget) for w in args.windows})
    cpu_us_per_sentence(encoder, items, plans["offline"][:20])  # warm-up
    runs: dict[str, list[float]] = {name: [] for name in plans}
    for _ in range(args.repeats):  # interleaved: a slow spell of the machine hits every plan alike
        for name, passes in plans.items():
            runs[name].append(cpu_us_per_sentence(encoder, items, passes))
    offline = statistics.median(runs["offline"])
    result = {
        "command": command(),
        "backend": args.backend,
        "budget": dict(
            zip(("max_batch_tokens", "max_batch_size", "max_padding", "padding_tokens"), budget, strict=True)
        ),
        "sentences": len(items),
        "load_at_end": load_average(),
        "plans": {
            name: {
                "passes": len(passes),
                "sentences_per_pass": round(len(items) / len(passes), 1),
                "padded_tokens_per_sentence": round(
                    sum(len(p) * max(lengths[i] for i in p) for p in passes) / len(items), 2
                ),
                "cpu_us_per_sentence": round(statistics.median(runs[name]), 1),
                "runs": [round(x, 1) for x in runs[name]],
                "to_offline": round(statistics.median(runs[name]) / offline, 3),
            }
            for name, passes in plans.items()
        },
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in result["plans"].items():
        print(
            f"{name:>12}: {row['sentences_per_pass']:5.1f} a pass, {row['cpu_us_per_sentence']:7.1f} us a sentence, "
            f"{row['to_offline']:.3f}x offline"
        )


if __name__ == "__main__":
    main()
