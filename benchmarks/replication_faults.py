"""The fault record of replication: rounds in a row on one loopback cluster (a moto S3 server, a writer and two
replicas, tests/replication/), each round the fault tests (3 a replica killed under searches, 4 a replica cut
from the bucket, 8 a frozen follower, 5 the bucket paused) and the scenarios of tests/replication/faults.py
(the writer killed just after a base past its last segment, then restarted; the bucket's answers to the writer
lost while its requests land, then a failover by the runbook; CURRENT.json garbled, or its version flipped,
then put back). The record of every round goes to a JSON file, each measured scenario with the writes it had
acknowledged, those lost, whether each replica equals the writer, seconds to converge and what /readyz said.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replication_faults.py --rounds 20 \
        --out benchmarks/results/replication_faults.json
    PYTHONPATH=$PWD .venv/bin/python benchmarks/replication_faults.py --quick --out /tmp/faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.provenance import command, load_average  # noqa: E402

QUICK = {"rounds": 2, "lost_answers_s": 6.0, "cut_s": 5.0}  # --quick: the harness works, in ~6 minutes


def rows_from_log(log: Path) -> list[dict]:
    """One row per scenario that pytest -v reported finished (PASSED / FAILED / ERROR), in order."""
    found = re.findall(r"test_fault_round\[([\w-]+)\] (PASSED|FAILED|ERROR)", log.read_text(errors="replace"))
    return [row(f"test_fault_round[{name}]", outcome == "PASSED") for name, outcome in found]


def row(run: str, passed: bool) -> dict:
    number, scenario = run[len("test_fault_round[") : -1].split("-", 1)
    return {"run": run, "round": int(number), "scenario": scenario, "passed": passed}


def rows_from_junit(junit: Path) -> list[dict]:
    rows = []
    for case in ElementTree.parse(junit).iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        rows.append(
            row(case.get("name") or "", problem is None)
            | {"seconds": round(float(case.get("time") or 0), 1)}
            | ({"failure": (problem.get("message") or "")[:500]} if problem is not None else {})
        )
    return rows


def summary(rows: list[dict], figures: dict) -> dict:
    """Per scenario: rounds and green ones; for a measured one (its records in ``figures``) the writes
    acknowledged and lost, the rounds a replica differed from the writer, and seconds to converge."""
    found: dict[str, dict] = {}
    for each in rows:
        counts = found.setdefault(each["scenario"], {"rounds": 0, "green": 0})
        counts["rounds"] += 1
        counts["green"] += each["passed"]
    for name, records in figures.items():
        if name not in found or not all(isinstance(r, dict) and "acked" in r for r in records):
            continue  # a figure of the tests' own scenarios
        converged = [r["converged_s"] for r in records if r["converged_s"] is not None]
        found[name] |= {
            "remote_acked": sum(r["acked"]["remote"] for r in records),
            "remote_acked_lost_on_writer": sum(r["lost"]["remote"]["writer"] or 0 for r in records),
            "remote_acked_lost_on_a_replica": sum(worst_replica(r["lost"]["remote"]) for r in records),
            "local_acked": sum(r["acked"]["local"] for r in records),
            "local_acked_lost_on_writer": sum(r["lost"]["local"]["writer"] or 0 for r in records),
            "rounds_a_replica_differed": sum(not all(r["replicas_equal_writer"]) for r in records),
            # a round that began behind inherits an earlier scenario's damage: judge it by that one
            "rounds_begun_unconverged": sum(not r["began_converged"] for r in records),
            "overlapping_segments": sum(r.get("tail", {}).get("overlaps", 0) for r in records),
            "converged_s": {
                "median": round(statistics.median(converged), 2) if converged else None,
                "max": max(converged, default=None),
                "never": len(records) - len(converged),
            },
        }
    return found


def worst_replica(lost: dict[str, int | None]) -> int:
    """The most acknowledged writes one replica lacks (one that would not list its documents: -1)."""
    return max(
        (-1 if count is None else count for name, count in lost.items() if name != "writer"), default=0
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", "--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK}: shows the harness works")
    parser.add_argument(
        "--lost-answers-s", type=float, default=20.0, help="the bucket's answers lost so long"
    )
    parser.add_argument("--cut-s", type=float, default=10.0, help="test 4's partition")
    parser.add_argument(
        "--base-every", type=int, default=50, help="the writer's bases, until writer-restarted's kill"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/replication_faults.json")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "replication_faults.log")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    settings = {
        "REPLICA_FAULT_ROUNDS": str(args.rounds),
        "REPLICA_LOST_ANSWERS_SECONDS": str(args.lost_answers_s),
        "REPLICA_CUT_SECONDS": str(args.cut_s),
        "REPLICA_BASE_EVERY": str(args.base_every),
    }
    with tempfile.TemporaryDirectory() as folder:
        junit, figures = Path(folder) / "junit.xml", Path(folder) / "figures.json"
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-v",
                "-m",
                "replicas",
                "-k",
                "fault_round",
                "-p",
                "no:cacheprovider",
                "-o",
                "timeout=3600",
                f"--junitxml={junit}",
                "tests/replication",
            ],
            cwd=REPO,
            env={**os.environ, "REPLICA_RESULTS": str(figures), **settings},
            stdout=args.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        # a run stopped early leaves no junit file: its log says as much
        rows = rows_from_junit(junit) if junit.exists() else rows_from_log(args.log)
        found = json.loads(figures.read_text()) if figures.exists() else {}
        record = {
            "command": command(),
            "what": "each round, in order: tests 3 (a replica killed under 1,000 searches), 4 (a replica cut "
            "from the bucket), 8 (a frozen follower), 5 (the bucket paused), then writer-restarted, "
            "answers-lost-then-failover (answers closed in odd rounds, dropped in even ones), current-garbled "
            "and current-version-flipped (tests/replication/faults.py); --rounds times in a row on one "
            "cluster (a moto S3 server, a writer and two replicas on loopback, tiny model); a scenario that "
            "leaves replicas unable to continue is followed by a rebuild (rebuilt_after)",
            "engine": "changelog segments and snapshot bases in the S3 bucket (index/replication)",
            "settings": settings,
            "rounds": args.rounds,
            "scenarios_run": len(rows),
            "green": sum(each["passed"] for each in rows),
            "exit_code": done.returncode,
            "total_seconds": round(time.monotonic() - started, 1),
            "summary": summary(rows, found),
            # scenarios that left replicas unable to continue: a rebuild's new base got them going again
            "rebuilt_after": found.get("rebuilt_after", []),
            "rows": rows,
            "figures": found,
            "load_average": load_average(),
        }
        if done.returncode != 0:
            record["output_tail"] = args.log.read_text(errors="replace")[-4000:]
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    keys = ("scenarios_run", "green", "exit_code", "total_seconds", "summary", "rebuilt_after")
    print(json.dumps({k: record[k] for k in keys}, indent=1))


if __name__ == "__main__":
    main()
