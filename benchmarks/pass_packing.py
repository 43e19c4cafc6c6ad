"""How much inference a served text costs against the same text embedded offline, from the way passes pack.

Offline, ``embed`` plans all 2,000 sentences at once: sorted by length, neighbours match and batches fill.
Served one sentence a request at 64 connections, each pass is planned over the few dozen texts queued at
that moment, so length-matched neighbours are fewer and passes smaller; every pass also pays a fixed cost
(``benchmarks/results/pass_cost_int8_calibrated.json``: 11.75 padded tokens' worth on ONNX int8, the
median up to width 32). With a pass's cost modelled as that fixed cost plus its padded tokens, this
replays a steady queue of ``pool`` texts (each pass's texts replaced by new ones drawn from the sentences)
under two planners for the pass that takes the oldest text:
- ``service``: ``MicroBatcher``'s plan (``plan_batches`` under the backend's padding bound and allowance);
- ``optimal``: the cheapest partition of the sorted queue into contiguous batches (dynamic programming over
  the model's cost), i.e. the best any length-sorting planner could do with the same queue.
Both are reported against the offline plan as modelled inference cost per text. Real token lengths, from
the bundled model's tokenizer; no timing, so the result does not depend on the machine's speed.

    python benchmarks/pass_packing.py [--out benchmarks/results/pass_packing.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.http_throughput import distinct_sentences  # noqa: E402
from benchmarks.provenance import command  # noqa: E402
from encoder_runtime.batcher import oldest_pass  # noqa: E402
from encoder_runtime.tokenization import plan_batches  # noqa: E402

PASS_COST = ROOT / "benchmarks" / "results" / "pass_cost_int8_calibrated.json"


def pass_cost(lengths: list[int], batch: list[int], fixed: float) -> float:
    return fixed + len(batch) * max(lengths[i] for i in batch)


def optimal_pass(lengths: list[int], budget: tuple, fixed: float) -> list[int]:
    """The batch holding the oldest text (position 0) in the cheapest contiguous partition of the sorted
    queue, under the same token and size limits as the service's plan."""
    max_tokens, max_size = budget[0], budget[1]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        width = lengths[order[end - 1]]
        for start in range(end - 1, max(-1, end - 1 - max_size), -1):
            if (end - start) * width > max_tokens:
                break
            cost = best[start] + fixed + (end - start) * width
            if cost < best[end]:
                best[end], cut[end] = cost, start
    end = len(order)
    while end:
        batch = order[cut[end] : end]
        if 0 in batch:
            return batch
        end = cut[end]
    raise AssertionError("the oldest text is in no batch")


def replay(planner, lengths: list[int], pool: int, passes: int, fixed: float, seed: int = 0) -> dict:
    """A queue kept at ``pool`` texts: each pass takes the oldest text's batch, new texts refill it."""
    rng = random.Random(seed)
    queue = [rng.choice(lengths) for _ in range(pool)]
    cost = texts = 0.0
    for _ in range(passes):
        batch = planner(queue)
        cost += pass_cost(queue, batch, fixed)
        texts += len(batch)
        taken = set(batch)
        queue = [length for i, length in enumerate(queue) if i not in taken]
        queue += [rng.choice(lengths) for _ in batch]
    return {"cost_per_text": cost / texts, "texts_per_pass": texts / passes}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", type=int, nargs="+", default=[16, 32, 50])
    parser.add_argument("--passes", type=int, default=4000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pass_packing.json"))
    args = parser.parse_args()

    from encoder_runtime import load_encoder

    encoder = load_encoder(backend="onnx-int8")
    budget = encoder.batch_budget
    fixed = json.loads(PASS_COST.read_text())["backends"]["onnx-int8"]["fixed_pass_in_tokens_median_up_to_32"]
    lengths = [len(item) for item in encoder.encode(distinct_sentences(2000))]
    offline_batches = plan_batches(lengths, *budget)
    offline = {
        "cost_per_text": sum(pass_cost(lengths, b, fixed) for b in offline_batches) / len(lengths),
        "texts_per_pass": len(lengths) / len(offline_batches),
    }
    print(
        f"offline: {offline['cost_per_text']:.2f} token-equivalents a text, {offline['texts_per_pass']:.1f} a pass"
    )
    pools = {}
    for pool in args.pools:
        row = {
            "service": replay(lambda queue: oldest_pass(queue, *budget), lengths, pool, args.passes, fixed),
            "optimal": replay(
                lambda queue: optimal_pass(queue, budget, fixed), lengths, pool, args.passes, fixed
            ),
        }
        for planner in row.values():
            planner["cost_over_offline"] = planner["cost_per_text"] / offline["cost_per_text"]
        pools[str(pool)] = row
        print(
            f"pool {pool:3d}: service {row['service']['cost_over_offline']:.3f}x offline"
            f" ({row['service']['texts_per_pass']:.1f} a pass), optimal {row['optimal']['cost_over_offline']:.3f}x"
            f" ({row['optimal']['texts_per_pass']:.1f} a pass)"
        )
    result = {
        "command": command(),
        "model": "bundled all-MiniLM-L6-v2, ONNX int8 tokenizer and batch settings",
        "sentences": len(lengths),
        "fixed_pass_cost_tokens": fixed,
        "fixed_pass_cost_from": str(PASS_COST.relative_to(ROOT)),
        "batch_settings": dict(
            zip(["max_batch_tokens", "max_batch_size", "max_padding", "padding_tokens"], budget, strict=True)
        ),
        "passes_replayed": args.passes,
        "offline": offline,
        "pools": pools,
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
