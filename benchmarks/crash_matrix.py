"""The crash suite's cases (``tests/e2e/crashes.py``) at a larger size, several rounds, each on a fresh
index on a small tmpfs (root needed for the mount): longer write streams before the first SIGKILL, bigger
batches, optionally the real bundled model instead of the tiny random one.

    python benchmarks/crash_matrix.py --rounds 3 --stream-acks 200 --batch 8
    python benchmarks/crash_matrix.py --rounds 1 --model bundled

Writes ``benchmarks/results/crash_matrix.json`` (every row of every round, the load average) and prints
the per-case table: acknowledged documents vs. those found afterwards (0 lost is the bar).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.crashes import Chain, mount_tmpfs, run_all, unmount  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from harness.tiny_model import make_tiny_bert  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--stream-acks", type=int, default=200, help="acknowledged writes before case 1's kill"
    )
    parser.add_argument("--batch", type=int, default=8, help="documents per write in the other cases")
    parser.add_argument("--model", choices=["tiny", "bundled"], default="tiny")
    parser.add_argument("--disk-mb", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS / "crash_matrix.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rounds, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="crash-matrix-") as scratch:
        work = Path(scratch)
        if args.model == "tiny":
            model = make_tiny_bert(work / "tiny-bert")
        else:
            from encoder_runtime.model_dir import bundled_model_path

            model = bundled_model_path()
        for number in range(args.rounds):
            folder = work / f"round-{number}"
            disk = folder / "disk"
            mount_tmpfs(disk, args.disk_mb)
            # A different kill instant each round: the stream runs to a random count around the target.
            acks = random.Random(number).randint(args.stream_acks // 2, args.stream_acks)
            chain = Chain(root=disk / "idx", model=model, work=folder, rng=random.Random(100 + number))
            round_started = time.perf_counter()
            try:
                rows = run_all(chain, stream_acks=acks, batch=args.batch)
            finally:
                if chain.server is not None:
                    chain.server.kill()
                unmount(disk)
            rounds.append(
                {"round": number, "seconds": round(time.perf_counter() - round_started, 1), "rows": rows}
            )
            print(
                f"round {number}: {sum(r['lost'] for r in rows)} lost of {rows[-1]['acknowledged']}",
                flush=True,
            )
    result = {
        "command": command(),
        "model": args.model,
        "rounds": rounds,
        "total_lost": sum(r["lost"] for rnd in rounds for r in rnd["rows"]),
        "seconds": round(time.perf_counter() - started, 1),
        "load_average_at_end": load_average(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| case | acknowledged | found | lost |")
    print("|---|---|---|---|")
    for row in rounds[-1]["rows"]:
        print(f"| {row['case']} | {row['acknowledged']} | {row['found']} | {row['lost']} |")


if __name__ == "__main__":
    main()
