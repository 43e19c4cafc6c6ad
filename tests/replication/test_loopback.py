"""Replication's tests on loopback (no Docker), numbered as in docs/deployment.md: they run in order on one
cluster (``conftest.cluster``): a moto S3 server, a writer and two replicas. Marker ``replicas``: ``make
test-replicas`` runs them; ``make test`` does not (6 to 9 minutes on two cores)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from harness.crashes import AUTH, Server, wait_ready
from harness.replication import BUCKET, replication_env
from tests.replication.conftest import (
    ACK_TIMEOUT_S,
    GC_AFTER_S,
    STALE_AFTER_S,
    WATCHDOG_S,
    Cluster,
    documents,
    replication,
    wait_converged,
)

pytestmark = pytest.mark.replicas
CUT_S = float(os.environ.get("REPLICA_CUT_SECONDS", "10"))  # a 30 s partition: REPLICA_CUT_SECONDS=30
# benchmarks/replication_faults.py: the fault tests (3, 4, 8, 5) again this many times on the same cluster
FAULT_ROUNDS = int(os.environ.get("REPLICA_FAULT_ROUNDS", "0"))


def top_hit(server: Server, text: str) -> str | None:
    answer = httpx.post(
        server.url + "/search", json={"query": text, "top_k": 1, "mode": "dense"}, headers=AUTH, timeout=30
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    return results[0]["id"] if results else None


def bucket_keys(cluster: Cluster) -> list[str]:
    pages = cluster.moto.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def search_ids(server: Server, text: str, mode: str) -> list[str]:
    body = {"query": text, "top_k": 5, "mode": mode}
    answer = httpx.post(server.url + "/search", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text
    return [hit["id"] for hit in answer.json()["results"]]


def test_1_replicas_answer_as_the_writer_after_bootstrap(cluster: Cluster) -> None:
    wait_converged(cluster)
    expected = documents(cluster.writer)
    assert len(expected) == 50
    probes = list(cluster.chain.acked.values())[:10]
    for replica in cluster.replicas:
        assert documents(replica) == expected
        for text in probes:
            for mode in ("dense", "bm25", "hybrid"):
                assert search_ids(replica, text, mode) == search_ids(cluster.writer, text, mode)
        state = replication(replica)
        assert state["lag"] == 0 and not state["stale"], state


def test_2_two_clients_upsert_100_batches_and_every_replica_has_them(cluster: Cluster) -> None:
    chain = cluster.chain
    statuses: Counter[int] = Counter()

    def client(batches: int) -> None:
        for _ in range(batches):
            statuses[chain.put(chain.new_docs(5))] += 1

    threads = [threading.Thread(target=client, args=(50,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == {200: 100}
    wait_converged(cluster)
    writer_docs = documents(cluster.writer)
    writer_counts = httpx.get(cluster.writer.url + "/index/fields", headers=AUTH).json()["counts"]
    for replica in cluster.replicas:
        assert documents(replica) == writer_docs
        assert {doc_id: text for doc_id, (text, _) in writer_docs.items()} == chain.acked
        assert httpx.get(replica.url + "/index/fields", headers=AUTH).json()["counts"] == writer_counts
        with ThreadPoolExecutor(4) as pool:
            hits = list(pool.map(lambda text, r=replica: top_hit(r, text), chain.acked.values()))
        assert hits == list(chain.acked), "an acknowledged document is not its own top hit on a replica"
        assert replication(replica)["applied_seq"] == replication(cluster.writer)["seq"]


class Gateway:
    """Round robin over the replicas; a request a replica does not answer goes to the next (nginx's
    ``proxy_next_upstream``). Counts the requests no replica answered with 200."""

    def __init__(self, replicas: list[Server]):
        self.replicas, self.turn = replicas, 0
        self.failures: list[str] = []
        self.answered = 0
        self.guard = threading.Lock()

    def search(self, text: str) -> None:
        with self.guard:
            self.turn += 1
            first = self.turn
        for attempt in range(len(self.replicas)):
            server = self.replicas[(first + attempt) % len(self.replicas)]
            try:
                answer = httpx.post(
                    server.url + "/search", json={"query": text, "top_k": 3}, headers=AUTH, timeout=10
                )
            except httpx.TransportError:
                continue  # connection refused or reset: the next upstream
            with self.guard:
                if answer.status_code == 200:
                    self.answered += 1
                else:
                    self.failures.append(f"{answer.status_code}: {answer.text[:200]}")
            return
        with self.guard:
            self.failures.append("no replica answered")


def write_in_background(cluster: Cluster, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            cluster.chain.put(cluster.chain.new_docs(3))
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_3_a_replica_killed_under_searches_rejoins_and_converges(cluster: Cluster, record) -> None:
    gateway = Gateway(cluster.replicas)
    texts = list(cluster.chain.acked.values())
    stop = threading.Event()
    writes = write_in_background(cluster, stop)
    victim = cluster.replicas[0]
    try:
        with ThreadPoolExecutor(4) as clients:  # four clients at once, as a gateway sees them
            list(clients.map(gateway.search, random.choices(texts, k=200)))
            victim.process.send_signal(signal.SIGKILL)
            victim.process.wait(timeout=30)
            list(clients.map(gateway.search, random.choices(texts, k=800)))
    finally:
        stop.set()
        writes.join(timeout=60)
    assert not gateway.failures and gateway.answered == 1000, gateway.failures[:5]
    restarted = time.monotonic()
    cluster.start_replica(0)
    converged = wait_converged(cluster, timeout=60)
    record("killed_replica_converged_s", time.monotonic() - restarted)
    record("killed_replica_converged_after_ready_s", converged)
    assert documents(cluster.replicas[0]) == documents(cluster.writer)


def test_4_a_replica_cut_from_the_bucket_serves_flags_stale_and_converges(cluster: Cluster, record) -> None:
    cut, other = cluster.replicas[1], cluster.replicas[0]
    chain = cluster.chain
    order: list[list[str]] = []  # the batches, in the order the writer acknowledged them
    phase = f"cut-{time.monotonic_ns()}"  # this run's documents (the fault rounds repeat this test)

    def write_batch() -> None:
        batch = [d | {"metadata": {"phase": phase}} for d in chain.new_docs(4)]
        assert chain.put(batch) == 200
        order.append([d["id"] for d in batch])

    write_batch()
    wait_converged(cluster)
    cluster.proxies[1].cut()
    started = time.monotonic()
    flagged_after = None
    codes: Counter[int] = Counter()
    seen_states = []
    while time.monotonic() - started < CUT_S:
        write_batch()
        answer = httpx.get(cut.url + "/readyz", headers=AUTH, timeout=5)
        codes[answer.status_code] += 1
        if flagged_after is None and answer.json()["collections"]["default"]["replication"]["stale"]:
            flagged_after = time.monotonic() - started
        codes[httpx.post(cut.url + "/search", json={"query": "x"}, headers=AUTH, timeout=10).status_code] += 1
        held = set(documents(cut, json.dumps({"phase": phase})))
        seen_states.append(held)
        time.sleep(0.2)
    cluster.proxies[1].heal()
    healed = time.monotonic()
    converged = wait_converged(cluster, timeout=30)
    record("cut_flagged_stale_after_s", flagged_after)
    record("cut_healed_converged_s", time.monotonic() - healed)
    assert set(codes) == {200}, codes
    assert flagged_after is not None and flagged_after <= STALE_AFTER_S + 5, flagged_after
    for held in seen_states:  # a state the writer had: a prefix of the acknowledged batches, whole batches
        prefix = [doc_id for batch in order[: len(held) // 4] for doc_id in batch]
        assert len(held) % 4 == 0 and held == set(prefix), sorted(held)
    assert converged <= 10
    assert documents(cut) == documents(cluster.writer) == documents(other)


def test_7_a_rebuild_and_a_restore_reach_the_replicas(cluster: Cluster) -> None:
    chain, writer = cluster.chain, cluster.writer
    before = replication(writer)["version"]
    assert chain.job(chain.rebuild())["status"] == "succeeded"
    wait_converged(cluster, timeout=60)
    assert replication(writer)["version"] > before
    for replica in cluster.replicas:
        assert replication(replica)["version"] == replication(writer)["version"]
    snapshot = httpx.post(writer.url + "/collections/default/snapshots", headers=AUTH, timeout=60)
    assert snapshot.status_code == 201, snapshot.text
    rolled_back = chain.new_docs(3)
    assert chain.put(rolled_back) == 200
    wait_converged(cluster)
    name = snapshot.json()["name"]
    restored = httpx.post(
        f"{writer.url}/collections/default/snapshots/{name}/restore", headers=AUTH, timeout=60
    )
    assert restored.status_code == 200, restored.text
    for doc in rolled_back:
        chain.acked.pop(doc["id"])
    wait_converged(cluster, timeout=60)
    expected = documents(writer)
    assert not set(expected) & {d["id"] for d in rolled_back}
    for replica in cluster.replicas:
        assert documents(replica) == expected
    # the writer's garbage collection: the versions before the restore's leave the bucket, its own stays
    live = f"e1/v{replication(writer)['version']}/"
    deadline = time.monotonic() + GC_AFTER_S + 20
    while time.monotonic() < deadline:
        held = {key.split("/default/", 1)[1] for key in bucket_keys(cluster)}
        if all(key.startswith((live, "e1/heartbeat")) or key == "CURRENT.json" for key in held):
            break
        time.sleep(0.5)
    assert any(key.startswith(live + "base-") for key in held), held
    assert all(key.startswith((live, "e1/heartbeat")) or key == "CURRENT.json" for key in held), held


def test_8_a_frozen_follower_is_restarted_by_the_watchdog(cluster: Cluster) -> None:
    frozen = cluster.replicas[0]  # restarted by test 3: its pause point has not fired in this process yet
    armed = cluster.chain.work / "replica0.armed"
    marker = cluster.chain.work / "replica0.paused"
    armed.touch()
    try:
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "replication"  # the follower thread is frozen there
        assert cluster.chain.put(cluster.chain.new_docs(5)) == 200
        wait_converged(cluster, timeout=WATCHDOG_S + 20)  # only a new thread can have applied that write
        assert replication(frozen)["watchdog_restarts"] >= 1
        assert marker.exists()  # the frozen thread is still frozen: the write came through its successor
    finally:
        armed.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)  # the old thread wakes, finds itself replaced, and ends


def test_5_a_paused_bucket_stops_remote_acks_not_local_writes(cluster: Cluster, record) -> None:
    chain, writer = cluster.chain, cluster.writer
    cluster.moto.pause()
    try:
        started = time.monotonic()
        sent = chain.new_docs(3)
        local = httpx.put(
            writer.url + "/documents", params={"ack": "local"}, json=sent, headers=AUTH, timeout=30
        )
        record("paused_bucket_local_write_s", time.monotonic() - started)
        assert local.status_code == 200, local.text
        chain.acked |= {d["id"]: d["text"] for d in sent}
        started = time.monotonic()
        remote = httpx.put(
            writer.url + "/documents",
            params={"ack": "remote"},
            json=chain.new_docs(3),
            headers=AUTH,
            timeout=30,
        )
        record("paused_bucket_remote_write_s", time.monotonic() - started)
        assert remote.status_code == 503, remote.text
        assert "not yet durable in the bucket" in remote.json()["error"]
        for doc in json.loads(
            remote.request.content
        ):  # committed on the writer: it ships once the bucket is back
            chain.acked[doc["id"]] = doc["text"]
        assert time.monotonic() - started < ACK_TIMEOUT_S + 10
    finally:
        cluster.moto.resume()
    after = chain.new_docs(2)
    answer = httpx.put(
        writer.url + "/documents", params={"ack": "remote"}, json=after, headers=AUTH, timeout=30
    )
    assert answer.status_code == 200, answer.text
    chain.acked |= {d["id"]: d["text"] for d in after}
    wait_converged(cluster, timeout=60)
    for replica in cluster.replicas:
        held = documents(replica)
        assert {doc_id: text for doc_id, (text, _) in held.items()} == chain.acked


def test_6_the_writer_killed_replicas_go_on_answering(cluster: Cluster) -> None:
    wait_converged(cluster)
    cluster.writer.process.send_signal(signal.SIGKILL)
    cluster.writer.process.wait(timeout=30)
    statuses: Counter[int] = Counter()
    texts = list(cluster.chain.acked.values())
    for _ in range(100):
        for replica in cluster.replicas:
            statuses[
                httpx.post(
                    replica.url + "/search", json={"query": random.choice(texts)}, headers=AUTH, timeout=10
                ).status_code
            ] += 1
    time.sleep(2)
    for replica in cluster.replicas:
        state = replication(replica)
        assert state["writer_heartbeat_age_s"] > 1.5, state
        with contextlib.suppress(httpx.HTTPError):
            statuses[httpx.get(replica.url + "/documents/doc-1", headers=AUTH, timeout=10).status_code] += 1
    assert statuses == {200: 202}, statuses


def test_9_failover_by_the_runbook_loses_no_acknowledged_write(cluster: Cluster) -> None:
    """After test 6: the dead writer's volume is deleted, replica 1 is promoted with epoch 2 (the runbook in
    docs/deployment.md), replica 0 follows it; the old writer started again at epoch 1 is fenced."""
    chain = cluster.chain
    shutil.rmtree(chain.root)  # the writer's volume is gone: only the bucket and the replicas remain
    promoted_folder = chain.work / "replica1"
    cluster.replicas[1].kill()
    writer_env = {"CLOZE_INDEX": str(promoted_folder), "CLOZE_INDEX_PAUSE_AT": ""}
    chain.start("promoted", writer_env | replication_env("writer", cluster.moto.url, epoch="2", poll_s="0.3"))
    cluster.replicas = cluster.replicas[:1]
    wait_converged(cluster, timeout=60)
    assert replication(cluster.replicas[0])["epoch"] == 2
    held = documents(cluster.replicas[0])
    assert {doc_id: text for doc_id, (text, _) in held.items()} == chain.acked  # every acknowledged write
    more = chain.new_docs(3)
    answer = httpx.put(cluster.writer.url + "/documents", params={"ack": "remote"}, json=more, headers=AUTH)
    assert answer.status_code == 200, answer.text
    chain.acked |= {d["id"]: d["text"] for d in more}
    wait_converged(cluster)
    assert set(documents(cluster.replicas[0])) == set(chain.acked)

    zombie = chain.spawn(
        "zombie", {"CLOZE_INDEX": str(chain.work / "zombie")} | replication_env("writer", cluster.moto.url)
    )
    try:
        wait_ready(zombie)
        deadline = time.monotonic() + 30
        while not replication(zombie).get("fenced") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "epoch 2" in (replication(zombie).get("fenced") or ""), replication(zombie)
        refused = httpx.put(zombie.url + "/documents", json=chain.new_docs(1), headers=AUTH, timeout=30)
        assert refused.status_code == 503, refused.text
        current = cluster.moto.client().get_object(Bucket=BUCKET, Key="loopback/default/CURRENT.json")
        assert json.loads(current["Body"].read())["epoch"] == 2
    finally:
        zombie.kill()


if FAULT_ROUNDS:

    @pytest.mark.parametrize("round_number", range(1, FAULT_ROUNDS + 1))
    def test_fault_round(cluster: Cluster, record, round_number: int) -> None:
        test_3_a_replica_killed_under_searches_rejoins_and_converges(cluster, record)
        test_4_a_replica_cut_from_the_bucket_serves_flags_stale_and_converges(cluster, record)
        test_8_a_frozen_follower_is_restarted_by_the_watchdog(cluster)
        test_5_a_paused_bucket_stops_remote_acks_not_local_writes(cluster, record)
