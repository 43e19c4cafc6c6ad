"""Replication's tests on loopback (no Docker), numbered as in docs/deployment.md: they run in order on one
cluster (``conftest.cluster``): a moto S3 server, a writer and two replicas. Marker ``replicas``: ``make
test-replicas`` runs them; ``make test`` does not (6 to 9 minutes on two cores). The bodies the Docker tier
(tests/deploy/test_replicas.py) runs as well live in ``scenarios``."""

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
from tests.replication import faults, scenarios
from tests.replication.conftest import (
    ACK_TIMEOUT_S,
    GC_AFTER_S,
    STALE_AFTER_S,
    WATCHDOG_S,
    WRITER_ONLY_MODEL,
    Cluster,
    documents,
    replication,
    volume,
    wait_converged,
)

pytestmark = pytest.mark.replicas
CUT_S = float(os.environ.get("REPLICA_CUT_SECONDS", "10"))  # a 30 s partition: REPLICA_CUT_SECONDS=30
# benchmarks/replication_faults.py: the fault tests (3, 4, 8, 5) and the scenarios of ``faults`` again this
# many times on the same cluster, the bucket's answers to the writer lost for so many seconds in each round
FAULT_ROUNDS = int(os.environ.get("REPLICA_FAULT_ROUNDS", "0"))
LOST_ANSWERS_S = float(os.environ.get("REPLICA_LOST_ANSWERS_SECONDS", "20"))
BASE_EVERY = int(os.environ.get("REPLICA_BASE_EVERY", "50"))  # before the writer-restarted scenario's kill


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


def test_1_replicas_answer_as_the_writer_after_bootstrap(cluster: Cluster) -> None:
    scenarios.replicas_answer_as_the_writer(cluster, expected_documents=50)


def test_2_two_clients_upsert_100_batches_and_every_replica_has_them(cluster: Cluster) -> None:
    scenarios.two_clients_upsert_100_batches(cluster)
    acked = cluster.chain.acked
    for replica in cluster.replicas:
        with ThreadPoolExecutor(4) as pool:
            hits = list(pool.map(lambda text, r=replica: top_hit(r, text), acked.values()))
        assert hits == list(acked), "an acknowledged document is not its own top hit on a replica"


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
    figures = scenarios.a_replica_cut_off(cluster, 1, CUT_S, STALE_AFTER_S)
    record("cut_flagged_stale_after_s", figures["flagged_stale_after_s"])
    record("cut_healed_converged_s", figures["converged_after_heal_s"])


def test_7_a_rebuild_and_a_restore_reach_the_replicas(cluster: Cluster) -> None:
    scenarios.a_rebuild_and_a_restore(cluster)
    # the writer's garbage collection: the versions before the restore's leave the bucket, its own stays
    live = f"e1/v{replication(cluster.writer)['version']}/"
    deadline = time.monotonic() + GC_AFTER_S + 20
    while time.monotonic() < deadline:
        held = {key.split("/default/", 1)[1] for key in bucket_keys(cluster) if "/default/" in key}
        if all(key.startswith((live, "e1/heartbeat")) or key == "CURRENT.json" for key in held):
            break
        time.sleep(0.5)
    assert any(key.startswith(live + "base-") for key in held), held
    assert all(key.startswith((live, "e1/heartbeat")) or key == "CURRENT.json" for key in held), held


def test_8_a_frozen_follower_is_restarted_by_the_watchdog(cluster: Cluster) -> None:
    frozen = cluster.replicas[0]  # restarted by test 3: its pause point has not fired in this process yet
    armed = cluster.chain.work / "replica0.armed"
    marker = cluster.chain.work / "replica0.paused"
    try:
        scenarios.a_frozen_follower(
            cluster, frozen, WATCHDOG_S, armed.touch, lambda: marker.read_text() if marker.exists() else ""
        )
    finally:
        armed.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)  # the old thread wakes, finds itself replaced, and ends


def put_documents(server: Server, collection: str, docs: list[dict], **params: str) -> httpx.Response:
    url = f"{server.url}/collections/{collection}/documents"
    return httpx.put(url, params=params, json=docs, headers=AUTH, timeout=30)


def described(server: Server, collection: str) -> dict:
    answer = httpx.get(f"{server.url}/collections/{collection}", headers=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text
    return {k: answer.json()[k] for k in ("model", "dimension", "metric", "documents", "chunks")}


def hits(server: Server, collection: str, body: dict) -> list[tuple[str, float]]:
    url = f"{server.url}/collections/{collection}/search"
    answer = httpx.post(url, json={"top_k": 5, **body}, headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text
    return [(hit["id"], round(hit["score"], 4)) for hit in answer.json()["results"]]


def alike(got: list[tuple[str, float]], expected: list[tuple[str, float]], probe: dict) -> bool:
    """The same ranking; BM25's scores (bm25, and hybrid's fused ones are ranks) within 15%: tantivy scores
    with the statistics of what it has committed, and a replica restored from a base holds its documents
    committed while the writer may still hold them beside its index (index/storage/lexical.py)."""
    if probe.get("mode") != "bm25":
        return got == expected
    return [d for d, _ in got] == [d for d, _ in expected] and all(
        abs(a - b) <= 0.15 * max(abs(b), 1e-9) for (_, a), (_, b) in zip(got, expected, strict=True)
    )


def vector_docs(prefix: str, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "id": f"{prefix}-{i}",
            "text": f"{prefix} item {i}",
            "vector": [rng.uniform(-1, 1) for _ in range(4)],
        }
        for i in range(count)
    ]


def create_collection(server: Server, body: dict) -> None:
    answer = httpx.post(server.url + "/collections", json=body, headers=AUTH, timeout=60)
    assert answer.status_code == 201, answer.text


def delete_collection(server: Server, name: str) -> None:
    answer = httpx.delete(f"{server.url}/collections/{name}", headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text


def test_10_every_collection_is_replicated_and_one_made_again_never_mixes(cluster: Cluster, record) -> None:
    """After test 8 (its pause freezes default's follower alone), so the tests after it run with several
    collections: a model's, one of own vectors, and one whose model the replicas lack."""
    writer, replicas = cluster.writer, cluster.replicas
    create_collection(writer, {"name": "notes", "model": "default"})
    notes = cluster.chain.new_docs(12)
    # acknowledged remotely at once: only once the registry lists the collection and its tail is shipped
    assert put_documents(writer, "notes", notes[:6], ack="remote").status_code == 200
    assert put_documents(writer, "notes", notes[6:]).status_code == 200
    create_collection(writer, {"name": "vectors", "dimension": 4, "metric": "cosine"})
    old = vector_docs("old", 8, 1)
    assert put_documents(writer, "vectors", old).status_code == 200
    create_collection(writer, {"name": "writer-model", "model": WRITER_ONLY_MODEL})
    wait_converged(cluster, timeout=60, collections=("notes", "vectors"))
    probes = [{"query": d["text"], "mode": mode} for d in notes[:3] for mode in ("dense", "bm25", "hybrid")]
    probes += [{"vector": d["vector"]} for d in old[:3]] + [{"query": "old item", "mode": "bm25"}]
    for replica in replicas:
        for name in ("notes", "vectors"):
            assert documents(replica, collection=name) == documents(writer, collection=name)
            assert described(replica, name) == described(writer, name)
        for probe in probes:
            name = "vectors" if "vector" in probe or probe["query"] == "old item" else "notes"
            assert alike(hits(replica, name, probe), hits(writer, name, probe), probe), (name, probe)
        ready = httpx.get(replica.url + "/readyz", headers=AUTH, timeout=5)
        assert ready.status_code == 200, ready.text  # a collection it cannot follow leaves it in service
        unfollowed = ready.json()["collections"]["writer-model"]
        assert unfollowed["status"] == "failed" and WRITER_ONLY_MODEL in unfollowed["error"], unfollowed
        assert "CLOZE_MODELS" in unfollowed["error"]
        refused = [
            put_documents(replica, "notes", notes[:1]),
            httpx.post(replica.url + "/collections", json={"name": "x", "dimension": 4}, headers=AUTH),
            httpx.delete(replica.url + "/collections/notes", headers=AUTH),
        ]
        assert [r.status_code for r in refused] == [409, 409, 409], [r.text for r in refused]

    # Deleted and made again under its name: the replicas drop their copy and copy the new one, never a mix.
    old_folders = folders(cluster, "vectors@")
    assert len(old_folders) == 1, old_folders
    delete_collection(writer, "vectors")
    create_collection(writer, {"name": "vectors", "dimension": 4, "metric": "dot"})
    new = vector_docs("new", 5, 2)
    assert put_documents(writer, "vectors", new, ack="remote").status_code == 200
    old_ids, new_ids = {d["id"] for d in old}, {d["id"] for d in new}
    seen: list[set[str]] = []
    started = time.monotonic()
    while time.monotonic() - started < 60:
        for replica in replicas:
            with contextlib.suppress(AssertionError):  # 404 or 503 while the replica swaps them
                seen.append(set(documents(replica, collection="vectors")))
        with contextlib.suppress(TimeoutError):
            wait_converged(cluster, timeout=0.5, collections=("vectors",))
            break
    record("made_again_converged_s", time.monotonic() - started)
    assert all(held <= old_ids or held <= new_ids for held in seen), [sorted(h) for h in seen]
    for replica in replicas:
        assert documents(replica, collection="vectors") == documents(writer, collection="vectors")
        assert described(replica, "vectors")["metric"] == "dot"
        assert hits(replica, "vectors", {"vector": new[0]["vector"]}) == hits(
            writer, "vectors", {"vector": new[0]["vector"]}
        )

    # A replica started after all that copies every collection.
    env = cluster.replica_env(0) | replication_env("replica", cluster.moto.url, poll_s="0.3")
    fresh = cluster.chain.spawn("fresh", env | volume(cluster.chain.work, "fresh"))
    try:
        started = time.monotonic()
        wait_ready(fresh)
        wait_converged(cluster, timeout=60, replicas=[fresh], collections=("default", "notes", "vectors"))
        record("fresh_replica_every_collection_s", time.monotonic() - started)
        for name in ("default", "notes", "vectors"):
            assert documents(fresh, collection=name) == documents(writer, collection=name)
    finally:
        fresh.kill()
    # The old incarnation's folder leaves the bucket once unlisted for the grace period; the new one's stays.
    deadline = time.monotonic() + GC_AFTER_S + 20
    while folders(cluster, "vectors@") & old_folders and time.monotonic() < deadline:
        time.sleep(0.5)
    held = folders(cluster, "vectors@")
    assert len(held) == 1 and not held & old_folders, (held, old_folders)
    delete_collection(writer, "writer-model")
    deadline = time.monotonic() + 10
    while any("writer-model" in ready_collections(r) for r in replicas) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any("writer-model" in ready_collections(r) for r in replicas)


def folders(cluster: Cluster, start: str) -> set[str]:
    """The collection folders in the bucket whose names begin with ``start``."""
    return {found for key in bucket_keys(cluster) if (found := key.split("/")[1]).startswith(start)}


def ready_collections(server: Server) -> dict:
    return httpx.get(server.url + "/readyz", headers=AUTH, timeout=5).json()["collections"]


def test_5_a_paused_bucket_stops_remote_acks_not_local_writes(cluster: Cluster, record) -> None:
    figures = scenarios.a_paused_bucket(cluster, ACK_TIMEOUT_S)
    record("paused_bucket_local_write_s", figures["local_write_s"])
    record("paused_bucket_remote_write_s", figures["remote_write_s"])


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
    for folder in volume(chain.work, "writer").values():  # the writer's volume is gone: only the bucket
        shutil.rmtree(folder, ignore_errors=True)  # and the replicas remain
    cluster.replicas[1].kill()
    writer_env = volume(chain.work, "replica1") | {"CLOZE_INDEX_PAUSE_AT": ""}
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
    wait_converged(cluster, timeout=60, collections=("notes", "vectors"))  # test 10's, copied at epoch 2
    for name in ("notes", "vectors"):
        assert documents(cluster.replicas[0], collection=name) == documents(cluster.writer, collection=name)
        assert replication(cluster.replicas[0], name)["epoch"] == 2

    zombie = chain.spawn("zombie", volume(chain.work, "zombie") | replication_env("writer", cluster.moto.url))
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
    # The tests' scenarios assert; those of ``faults`` measure, and their record is kept before the verdict.
    ASSERTED = {
        "replica-killed": test_3_a_replica_killed_under_searches_rejoins_and_converges,
        "replica-cut": test_4_a_replica_cut_from_the_bucket_serves_flags_stale_and_converges,
        "follower-frozen": lambda cluster, record: test_8_a_frozen_follower_is_restarted_by_the_watchdog(
            cluster
        ),
        "bucket-paused": test_5_a_paused_bucket_stops_remote_acks_not_local_writes,
    }
    MEASURED = {
        "writer-restarted": lambda cluster, _: faults.a_writer_restart_after_a_base(cluster, BASE_EVERY),
        "answers-lost-then-failover": lambda cluster, round_number: faults.lost_answers_then_failover(
            cluster, LOST_ANSWERS_S, ("drop", "close")[round_number % 2]
        ),
        "current-garbled": lambda cluster, _: faults.current_damaged_and_put_back(cluster, "garbled"),
        "current-version-flipped": lambda cluster, _: faults.current_damaged_and_put_back(cluster, "version"),
    }
    ROUNDS = [(number, name) for number in range(1, FAULT_ROUNDS + 1) for name in [*ASSERTED, *MEASURED]]

    @pytest.mark.parametrize("round_number, name", ROUNDS, ids=[f"{n}-{name}" for n, name in ROUNDS])
    def test_fault_round(cluster: Cluster, record, round_number: int, name: str) -> None:
        try:
            if name in ASSERTED:
                ASSERTED[name](cluster, record)
                return
            figures = MEASURED[name](cluster, round_number)
            record(name, figures | {"round": round_number})
            assert figures["ok"], {
                k: figures[k] for k in ("acked", "lost", "replicas_equal_writer", "converged_s")
            }
        finally:
            if faults.repair_if_stuck(cluster):
                record("rebuilt_after", {"round": round_number, "scenario": name})
