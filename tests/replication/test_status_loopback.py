"""What replication says about itself, and what it takes for true, between real processes: a moto S3 server, a
writer and two replicas (``conftest.cluster``, a cluster of this module's own). In order: a replica following
steady writes is not stale; a damaged ``CURRENT.json`` is refused by replicas and replaced by the writer; writes
waiting for a paused bucket slow no probe; a writer started at an old epoch takes no write. Marker ``replicas``
(``make test-replicas``)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from harness.crashes import AUTH, wait_ready
from harness.replication import BUCKET, replication_env
from tests.replication.conftest import ACK_TIMEOUT_S, Cluster, documents, replication, volume, wait_converged

pytestmark = pytest.mark.replicas
CURRENT_KEY = "loopback/default/CURRENT.json"


def figure(name: str, value: float) -> None:
    print(f"figure {name}: {value:.3f}")  # shown with pytest -s


def test_a_replica_following_steady_writes_is_not_stale(cluster: Cluster) -> None:
    """Batches every ~0.1 s for 8 s: each replica applies them within a poll or two, so it is not stale (it said
    stale in two samples of three when only a poll that found nothing new counted)."""
    wait_converged(cluster, timeout=60)
    stop = threading.Event()
    refused: list[int] = []

    def write() -> None:
        while not stop.is_set():
            if (status := cluster.chain.put(cluster.chain.new_docs(3))) != 200:
                refused.append(status)
            time.sleep(0.1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    samples: list[dict] = []
    try:
        time.sleep(1)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            samples += [replication(replica) for replica in cluster.replicas]
            time.sleep(0.2)
    finally:
        stop.set()
        writer.join(timeout=30)
    stale = [s for s in samples if s["stale"]]
    figure("steady_writes_samples", len(samples))
    figure("steady_writes_stale_fraction", len(stale) / len(samples))
    figure("steady_writes_worst_staleness_s", max(s["staleness_s"] or 0 for s in samples))
    assert not refused, refused
    assert len(stale) <= len(samples) // 10, stale[:3]
    assert all(s["lag"] is not None for s in samples), samples[:3]
    wait_converged(cluster, timeout=60)


def test_a_damaged_current_json_is_refused_by_replicas_and_replaced_by_the_writer(cluster: Cluster) -> None:
    """One digit of ``version`` flipped (still valid JSON): no replica copies the base as that version, the
    writer puts a good one back, and a write after it reaches every replica."""
    wait_converged(cluster, timeout=60)
    s3 = cluster.moto.client()
    good = json.loads(s3.get_object(Bucket=BUCKET, Key=CURRENT_KEY)["Body"].read())
    bogus = good["version"] + 10
    s3.put_object(Bucket=BUCKET, Key=CURRENT_KEY, Body=json.dumps(good | {"version": bogus}).encode())
    seen: set[int | None] = set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        seen |= {replication(replica)["version"] for replica in cluster.replicas}
        time.sleep(0.1)
    assert bogus not in seen, seen
    current = json.loads(s3.get_object(Bucket=BUCKET, Key=CURRENT_KEY)["Body"].read())
    assert current["version"] == replication(cluster.writer)["version"] != bogus, current
    more = cluster.chain.new_docs(3)
    answer = httpx.put(
        cluster.writer.url + "/documents", params={"ack": "remote"}, json=more, headers=AUTH, timeout=30
    )
    assert answer.status_code == 200, answer.text
    cluster.chain.acked |= {d["id"]: d["text"] for d in more}
    wait_converged(cluster, timeout=60)
    for replica in cluster.replicas:
        assert documents(replica) == documents(cluster.writer)


def test_writes_waiting_for_a_paused_bucket_do_not_slow_readyz(cluster: Cluster) -> None:
    """120 remote-mode writes at once while the bucket is paused: each answers 503 once its wait times out
    (committed on the writer, shipped once the bucket is back), and /readyz answers at once while they wait.
    Probes during the burst itself (the writes arriving and committing) are reported, not judged."""
    wait_converged(cluster, timeout=60)
    batches = [cluster.chain.new_docs(1) for _ in range(120)]  # one chunk each: one sequence each
    committed_at = replication(cluster.writer)["seq"] + len(batches)

    def remote_write(docs: list[dict]) -> int:
        url = cluster.writer.url + "/documents"
        return httpx.put(url, params={"ack": "remote"}, json=docs, headers=AUTH, timeout=60).status_code

    burst: list[float] = []
    waiting: list[float] = []  # probes sent once every write was committed
    cluster.pause_bucket()
    try:
        with ThreadPoolExecutor(len(batches)) as clients:
            answers = [clients.submit(remote_write, docs) for docs in batches]
            all_committed = False
            while not all(answer.done() for answer in answers):
                started = time.monotonic()
                probe = httpx.get(cluster.writer.url + "/readyz", headers=AUTH, timeout=30)
                assert probe.status_code == 200, probe.text
                (waiting if all_committed else burst).append(time.monotonic() - started)
                all_committed = probe.json()["collections"]["default"]["replication"]["seq"] >= committed_at
                time.sleep(0.2)
            statuses = [answer.result() for answer in answers]
    finally:
        cluster.resume_bucket()
    figure("paused_bucket_readyz_during_the_burst_worst_s", max(burst))
    figure("paused_bucket_readyz_while_120_writes_wait_worst_s", max(waiting, default=-1))
    figure("paused_bucket_readyz_while_120_writes_wait_probes", len(waiting))
    assert statuses == [503] * len(batches), statuses
    for docs in batches:  # committed on the writer all the same
        cluster.chain.acked |= {d["id"]: d["text"] for d in docs}
    assert waiting and max(waiting) < ACK_TIMEOUT_S / 2, (
        burst,
        waiting,
    )  # each waited in a pool thread: 4.5 s
    wait_converged(cluster, timeout=60)
    for replica in cluster.replicas:
        held = documents(replica)
        assert {doc_id: text for doc_id, (text, _) in held.items()} == cluster.chain.acked


def test_a_writer_started_at_an_old_epoch_refuses_its_first_write(cluster: Cluster) -> None:
    """Replica 1 promoted at epoch 2 (the runbook); the old writer started again at epoch 1 answers its very
    first write 503, before and after it learns it was fenced, and so every other write: a collection made or
    deleted, a rebuild, a restore."""
    chain = cluster.chain
    wait_converged(cluster, timeout=60)
    old = chain.server
    assert old is not None
    old.kill()
    cluster.replicas[1].kill()
    promoted = volume(chain.work, "replica1") | {"CLOZE_INDEX_PAUSE_AT": ""}
    chain.start("promoted", promoted | replication_env("writer", cluster.moto.url, epoch="2", poll_s="0.3"))
    cluster.replicas = cluster.replicas[:1]
    wait_converged(cluster, timeout=60)
    zombie = chain.spawn("zombie", volume(chain.work, "writer") | replication_env("writer", cluster.moto.url))
    try:
        wait_ready(zombie)
        first = httpx.put(zombie.url + "/documents", json=chain.new_docs(1), headers=AUTH, timeout=30)
        assert first.status_code == 503, first.text
        assert "epoch 2" in (replication(zombie).get("fenced") or ""), replication(zombie)
        others = {
            "create": ("POST", "/collections", {"json": {"name": "late", "dimension": 4}}),
            "delete": ("DELETE", "/collections/late", {}),
            "rebuild": ("POST", "/index/rebuild", {}),
            "restore": ("POST", "/collections/default/restore", {"content": b"not read"}),
        }
        for what, (method, path, body) in others.items():
            answer = httpx.request(method, zombie.url + path, headers=AUTH, timeout=30, **body)
            assert answer.status_code == 503 and "epoch 2" in answer.text, (what, answer.text)
        listed = httpx.get(zombie.url + "/collections", headers=AUTH, timeout=30).json()
        assert [c["name"] for c in listed["collections"]] == ["default"], listed
    finally:
        zombie.kill()
