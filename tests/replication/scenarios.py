"""The bodies of replication's tests that both tiers run: the loopback tier (tests/replication/test_loopback.py,
`cloze serve` processes and a TCP proxy per replica) and the Docker tier (tests/deploy/test_replicas.py,
the compose profile's containers and networks). A tier hands in its cluster, which offers what ``Faults``
names; each scenario asserts, and returns its figures."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from harness.crashes import AUTH, Chain
from tests.replication.conftest import FROZEN_STAGE, documents, replication, wait_converged


class HasUrl(Protocol):
    url: str


class Faults(Protocol):
    """A cluster as the scenarios see it. ``chain.server`` is where writes go (the writer itself, or a gateway
    that routes them to it); ``writer`` and ``replicas`` are read directly."""

    chain: Chain
    replicas: list[Any]

    @property
    def writer(self) -> Any: ...

    def cut(self, number: int) -> None: ...  # replica ``number`` loses the bucket (a partition)

    def heal(self, number: int) -> None: ...

    def pause_bucket(self) -> None: ...  # the bucket stops answering, connections stay open

    def resume_bucket(self) -> None: ...


def search_ids(server: HasUrl, text: str, mode: str) -> list[str]:
    body = {"query": text, "top_k": 5, "mode": mode}
    answer = httpx.post(server.url + "/search", json=body, headers=AUTH, timeout=30)
    assert answer.status_code == 200, answer.text
    return [hit["id"] for hit in answer.json()["results"]]


def answers_alike(got: list[str], expected: list[str], mode: str) -> bool:
    """Dense: the same list. BM25 (and hybrid, which fuses its ranks): the same best hit and 4 of the 5 ids:
    tantivy scores with the statistics of what it has committed, and a replica's base holds committed what
    the writer may still hold beside its index (index/storage/lexical.py), so near ties can swap."""
    if mode == "dense":
        return got == expected
    return got[:1] == expected[:1] and len(set(got) & set(expected)) >= len(expected) - 1


def replicas_answer_as_the_writer(cluster: Faults, expected_documents: int) -> float:
    """(1): every replica holds the writer's documents and answers its searches in every mode."""
    seconds = wait_converged(cluster, timeout=60)  # type: ignore[arg-type]  # it reads writer and replicas
    expected = documents(cluster.writer)
    assert len(expected) == expected_documents
    probes = list(cluster.chain.acked.values())[:10]
    for replica in cluster.replicas:
        assert documents(replica) == expected
        for text in probes:
            for mode in ("dense", "bm25", "hybrid"):
                ours, writers = search_ids(replica, text, mode), search_ids(cluster.writer, text, mode)
                assert answers_alike(ours, writers, mode), (mode, text, ours, writers)
        state = replication(replica)
        assert state["lag"] == 0 and not state["stale"], state
    return seconds


def two_clients_upsert_100_batches(cluster: Faults) -> dict[str, Any]:
    """(2), up to the searches: every write answered 200, and every replica holds what the writer holds
    (the acknowledged documents, its counts, its sequence). Returns the new documents and the figures."""
    chain = cluster.chain
    statuses: Counter[int] = Counter()
    before = set(chain.acked)

    def client(batches: int) -> None:
        for _ in range(batches):
            statuses[chain.put(chain.new_docs(5))] += 1

    threads = [threading.Thread(target=client, args=(50,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == {200: 100}, statuses
    seconds = wait_converged(cluster, timeout=60)  # type: ignore[arg-type]
    writer_docs = documents(cluster.writer)
    assert {doc_id: text for doc_id, (text, _) in writer_docs.items()} == chain.acked
    writer_counts = httpx.get(cluster.writer.url + "/index/fields", headers=AUTH).json()["counts"]
    for replica in cluster.replicas:
        assert documents(replica) == writer_docs
        assert httpx.get(replica.url + "/index/fields", headers=AUTH).json()["counts"] == writer_counts
        assert replication(replica)["applied_seq"] == replication(cluster.writer)["seq"]
    new = {doc_id: text for doc_id, text in chain.acked.items() if doc_id not in before}
    return {"new": new, "converged_s": round(seconds, 2), "counts": writer_counts}


def a_replica_cut_off(cluster: Faults, number: int, cut_s: float, stale_after_s: float) -> dict[str, Any]:
    """(4): while replica ``number`` is cut off the bucket, batches go on; it answers 200, says `stale`
    within 5 s of the threshold, and only ever shows a prefix of whole acknowledged batches; healed, it
    converges within 10 s."""
    cut, other = cluster.replicas[number], cluster.replicas[1 - number]
    chain = cluster.chain
    order: list[list[str]] = []  # the batches, in the order the writer acknowledged them
    phase = f"cut-{time.monotonic_ns()}"  # this run's documents (the fault rounds repeat this test)

    def write_batch() -> None:
        batch = [d | {"metadata": {"phase": phase}} for d in chain.new_docs(4)]
        assert chain.put(batch) == 200
        order.append([d["id"] for d in batch])

    write_batch()
    wait_converged(cluster)  # type: ignore[arg-type]
    started = time.monotonic()  # before the cut: cutting may take a while (a `docker network disconnect`)
    cluster.cut(number)
    flagged_after = None
    codes: Counter[int] = Counter()
    seen_states = []
    try:
        while time.monotonic() - started < cut_s:
            write_batch()
            answer = httpx.get(cut.url + "/readyz", headers=AUTH, timeout=5)
            codes[answer.status_code] += 1
            if flagged_after is None and answer.json()["collections"]["default"]["replication"]["stale"]:
                flagged_after = time.monotonic() - started
            search = httpx.post(cut.url + "/search", json={"query": "x"}, headers=AUTH, timeout=10)
            codes[search.status_code] += 1
            seen_states.append(set(documents(cut, json.dumps({"phase": phase}))))
            time.sleep(0.2)
    finally:
        cluster.heal(number)
    healed = time.monotonic()
    converged = wait_converged(cluster, timeout=30)  # type: ignore[arg-type]
    assert set(codes) == {200}, codes
    assert flagged_after is not None and flagged_after <= stale_after_s + 5, flagged_after
    for held in seen_states:  # a state the writer had: a prefix of the acknowledged batches, whole batches
        prefix = [doc_id for batch in order[: len(held) // 4] for doc_id in batch]
        assert len(held) % 4 == 0 and held == set(prefix), sorted(held)
    assert converged <= 10, converged
    assert documents(cut) == documents(cluster.writer) == documents(other)
    return {
        "answers": dict(codes),
        "flagged_stale_after_s": round(flagged_after, 2),
        "states_checked": len(seen_states),
        "batches_written_during_cut": len(order) - 1,
        "converged_after_heal_s": round(time.monotonic() - healed, 2),
    }


def a_rebuild_and_a_restore(cluster: Faults) -> dict[str, Any]:
    """(7): a rebuild's new version and a restored snapshot reach every replica (sent where writes go)."""
    chain, writer = cluster.chain, cluster.writer
    write_url = chain.server.url  # type: ignore[union-attr]
    before = replication(writer)["version"]
    assert chain.job(chain.rebuild(), timeout=300)["status"] == "succeeded"
    rebuilt = wait_converged(cluster, timeout=90)  # type: ignore[arg-type]
    assert replication(writer)["version"] > before
    for replica in cluster.replicas:
        assert replication(replica)["version"] == replication(writer)["version"]
    snapshot = httpx.post(write_url + "/collections/default/snapshots", headers=AUTH, timeout=120)
    assert snapshot.status_code == 201, snapshot.text
    rolled_back = chain.new_docs(3)
    assert chain.put(rolled_back) == 200
    wait_converged(cluster)  # type: ignore[arg-type]
    name = snapshot.json()["name"]
    restored = httpx.post(
        f"{write_url}/collections/default/snapshots/{name}/restore", headers=AUTH, timeout=120
    )
    assert restored.status_code == 200, restored.text
    for doc in rolled_back:
        chain.acked.pop(doc["id"])
    restored_s = wait_converged(cluster, timeout=90)  # type: ignore[arg-type]
    expected = documents(writer)
    assert not set(expected) & {d["id"] for d in rolled_back}
    for replica in cluster.replicas:
        assert documents(replica) == expected
    return {
        "versions": [before, replication(writer)["version"]],
        "rebuild_converged_s": round(rebuilt, 2),
        "restore_converged_s": round(restored_s, 2),
    }


def a_frozen_follower(
    cluster: Faults, frozen: HasUrl, watchdog_s: float, arm: Callable[[], None], paused_at: Callable[[], str]
) -> dict[str, Any]:
    """(8): ``arm`` makes the follower of ``frozen`` stop at its pause point (``paused_at`` then names the
    stage); a write reaches that replica all the same, through the thread the watchdog started."""
    arm()
    deadline = time.monotonic() + 10
    while paused_at() != FROZEN_STAGE:
        assert time.monotonic() < deadline, "the follower never reached its pause point"
        time.sleep(0.05)
    frozen_at = time.monotonic()
    assert cluster.chain.put(cluster.chain.new_docs(5)) == 200
    wait_converged(cluster, timeout=watchdog_s + 20)  # type: ignore[arg-type]  # only a new thread can apply it
    restarts = replication(frozen)["watchdog_restarts"]
    assert restarts >= 1
    assert paused_at() == FROZEN_STAGE, "the frozen thread let go: the write may have come through it"
    return {"converged_after_freeze_s": round(time.monotonic() - frozen_at, 2), "watchdog_restarts": restarts}


def a_paused_bucket(cluster: Faults, ack_timeout_s: float) -> dict[str, Any]:
    """(5): with the bucket paused a local-mode write answers 200 and a remote-mode one 503 within the ack
    timeout (committed on the writer all the same); resumed, every replica holds every acknowledged write."""
    chain = cluster.chain
    write_url = chain.server.url  # type: ignore[union-attr]
    cluster.pause_bucket()
    try:
        started = time.monotonic()
        sent = chain.new_docs(3)
        local = httpx.put(
            write_url + "/documents", params={"ack": "local"}, json=sent, headers=AUTH, timeout=30
        )
        local_s = time.monotonic() - started
        assert local.status_code == 200, local.text
        chain.acked |= {d["id"]: d["text"] for d in sent}
        sent = chain.new_docs(3)
        started = time.monotonic()
        remote = httpx.put(
            write_url + "/documents", params={"ack": "remote"}, json=sent, headers=AUTH, timeout=30
        )
        remote_s = time.monotonic() - started
        assert remote.status_code == 503, remote.text
        assert "not yet durable in the bucket" in remote.json()["error"]
        chain.acked |= {
            d["id"]: d["text"] for d in sent
        }  # committed on the writer: it ships once the bucket is back
        assert remote_s < ack_timeout_s + 10
    finally:
        cluster.resume_bucket()
    after = chain.new_docs(2)
    answer = httpx.put(
        write_url + "/documents", params={"ack": "remote"}, json=after, headers=AUTH, timeout=30
    )
    assert answer.status_code == 200, answer.text
    chain.acked |= {d["id"]: d["text"] for d in after}
    wait_converged(cluster, timeout=60)  # type: ignore[arg-type]
    for replica in cluster.replicas:
        held = documents(replica)
        assert {doc_id: text for doc_id, (text, _) in held.items()} == chain.acked
    return {"local_write_s": round(local_s, 3), "remote_write_s": round(remote_s, 3)}
