"""What a thread per replicated collection costs while nothing changes: a writer's shippers, then a replica's
followers, for N empty collections of own vectors against a moto S3 server on loopback, in this process.

Per N: live threads, this process's CPU (seconds of CPU per second of wall time, all cores) and the bucket
requests per second, measured over ``--seconds`` once every collection is shipped (then copied). This is
what decided one worker thread per collection (``app/service/replication/``) over one thread stepping
them all: the idle cost is the bucket polls, which a single thread would make just the same.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/replication_threads.py \
        --out benchmarks/results/replication_threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402
from harness.replication import BUCKET, CREDENTIALS, MotoServer  # noqa: E402
from index.collections import CollectionInfo, create_collection  # noqa: E402
from index.replication.bucket import Bucket  # noqa: E402
from index.replication.follower import Follower  # noqa: E402
from index.replication.shipper import Shipper  # noqa: E402
from index.search_index import SearchIndex  # noqa: E402

POLL_S = 0.5  # CLOZE_REPLICATION_POLL_S's default


class Counted:
    """Bucket requests made, counted through botocore's events."""

    def __init__(self, bucket: Bucket):
        self.calls = 0
        bucket.client.meta.events.register("before-call.s3", self._count)

    def _count(self, **_: object) -> None:
        self.calls += 1


def idle(seconds: float, counted: Counted) -> dict[str, float]:
    calls, cpu, started = counted.calls, time.process_time(), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return {
        "threads": threading.active_count(),
        "cpu_per_s": round((time.process_time() - cpu) / wall, 4),
        "requests_per_s": round((counted.calls - calls) / wall, 1),
    }


def wait_for(check, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the workers did not ship or copy every collection in time")
        time.sleep(0.2)


def open_collections(root: Path, count: int) -> list[SearchIndex]:
    indexes = []
    for number in range(count):
        info = CollectionInfo(f"c{number}", None, dimension=4, metric="cosine")
        path = create_collection(root, info, info.own_vectors())
        indexes.append(SearchIndex.open(path, info.own_vectors(), create=False))
    return indexes


def measure(moto: MotoServer, work: Path, count: int, seconds: float) -> dict[str, object]:
    bucket = Bucket(f"s3://{BUCKET}/n{count}", moto.url, "us-east-1")
    counted = Counted(bucket)
    before = threading.active_count()
    writers = open_collections(work / f"w{count}", count)
    shippers = [
        Shipper(lambda i=i: i, bucket, bucket.keys(f"c{n}"), 1, work / "ship", 20_000, "bench", POLL_S)
        for n, i in enumerate(writers)
    ]
    for shipper in shippers:
        shipper.start()
    wait_for(lambda: all(s.shipped is not None for s in shippers))
    shipping = idle(seconds, counted)
    for shipper in shippers:
        shipper.stop()
    time.sleep(2 * POLL_S)
    replicas = open_collections(work / f"r{count}", count)
    followers = [
        Follower(lambda i=i: i, bucket, bucket.keys(f"c{n}"), work / "follow", POLL_S)
        for n, i in enumerate(replicas)
    ]
    for follower in followers:
        follower.start()
    wait_for(lambda: all(f.position(i) is not None for f, i in zip(followers, replicas, strict=True)))
    following = idle(seconds, counted)
    for follower in followers:
        follower.stop()
    for index in writers + replicas:
        index.close()
    return {
        "collections": count,
        "threads_before": before,
        "writer_idle": shipping,
        "replica_idle": following,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", default="1,10,40")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    with tempfile.TemporaryDirectory(prefix="replication-threads-") as folder:
        work = Path(folder)
        moto = MotoServer(work / "moto.log")
        try:
            rows = [measure(moto, work, int(n), args.seconds) for n in args.counts.split(",")]
        finally:
            moto.stop()
    result = {
        "command": command(),
        "load_average_after": load_average(),
        "poll_s": POLL_S,
        "seconds_per_measure": args.seconds,
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
