"""The fault tests of replication (tests/replication/: 3 a replica killed under searches, 4 a replica cut from
the bucket, 8 a frozen follower, 5 the bucket paused) run N times in a row on one cluster; the record of every
run goes to a JSON file.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replication_faults.py --runs 20 \
        --out benchmarks/results/replication_faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.provenance import command, load_average  # noqa: E402


def rows_from_log(log: Path) -> list[dict]:
    """One row per round that pytest -v reported finished (PASSED / FAILED / ERROR), in order."""
    found = re.findall(r"test_fault_round\[(\d+)\] (PASSED|FAILED|ERROR)", log.read_text(errors="replace"))
    return [
        {"run": f"test_fault_round[{number}]", "passed": outcome == "PASSED"} for number, outcome in found
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/replication_faults.json")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "replication_faults.log")
    args = parser.parse_args()
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
            env={**os.environ, "REPLICA_RESULTS": str(figures), "REPLICA_FAULT_ROUNDS": str(args.runs)},
            stdout=args.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        rows = rows_from_log(args.log)  # a run stopped early leaves no junit file: its log says as much
        if junit.exists():
            rows = []
            for case in ElementTree.parse(junit).iter("testcase"):
                problem = case.find("failure") if case.find("failure") is not None else case.find("error")
                rows.append(
                    {
                        "run": case.get("name"),
                        "passed": problem is None,
                        "seconds": round(float(case.get("time") or 0), 1),
                        **({"failure": (problem.get("message") or "")[:500]} if problem is not None else {}),
                    }
                )
        record = {
            "command": command(),
            "what": "tests 3 (a replica killed under 1,000 searches), 4 (a replica cut from the bucket), "
            "8 (a frozen follower) and 5 (the bucket paused), in that order, --runs times in a row on one "
            "cluster (a moto S3 server, a writer and two replicas on loopback, tiny model)",
            "engine": "changelog segments and snapshot bases in the S3 bucket (index/replication)",
            "runs": len(rows),
            "green": sum(row["passed"] for row in rows),
            "exit_code": done.returncode,
            "total_seconds": round(time.monotonic() - started, 1),
            "rows": rows,
            "figures": json.loads(figures.read_text()) if figures.exists() else {},
            "load_average": load_average(),
        }
        if done.returncode != 0:
            record["output_tail"] = args.log.read_text(errors="replace")[-4000:]
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("runs", "green", "exit_code", "total_seconds")}))


if __name__ == "__main__":
    main()
