"""The fault tests of replication (tests/replication/: 3 a replica killed under searches, 4 a replica cut from
the bucket, 5 the bucket paused, with 8 a frozen follower) run N times in a row, each run on a fresh cluster;
the record of every run goes to a JSON file.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replication_faults.py --runs 20 \
        --out benchmarks/results/replication_faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.provenance import command, load_average  # noqa: E402

FAULT_TESTS = "test_3 or test_4 or test_5 or test_8"


def one_run(number: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        junit, figures = Path(folder) / "junit.xml", Path(folder) / "figures.json"
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-m",
                "replicas",
                "-k",
                FAULT_TESTS,
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
                "tests/replication",
            ],
            cwd=REPO,
            env={**os.environ, "REPLICA_RESULTS": str(figures)},
            capture_output=True,
            text=True,
        )
        outcomes = {}
        if junit.exists():
            for case in ElementTree.parse(junit).iter("testcase"):
                failed = case.find("failure") is not None or case.find("error") is not None
                outcomes[case.get("name")] = "failed" if failed else "passed"
        row = {
            "run": number,
            "passed": done.returncode == 0,
            "seconds": round(time.monotonic() - started, 1),
            "tests": outcomes,
            "figures": json.loads(figures.read_text()) if figures.exists() else {},
        }
        if done.returncode != 0:
            row["output_tail"] = done.stdout[-3000:]
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/replication_faults.json")
    args = parser.parse_args()
    rows = []
    for number in range(1, args.runs + 1):
        rows.append(one_run(number))
        print(json.dumps({k: rows[-1][k] for k in ("run", "passed", "seconds", "tests")}), flush=True)
        record = {
            "command": command(),
            "tests": FAULT_TESTS,
            "engine": "changelog segments and snapshot bases in the S3 bucket (index/replication)",
            "runs": len(rows),
            "green": sum(row["passed"] for row in rows),
            "rows": rows,
            "load_average": load_average(),
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
