"""The loopback tier of replication (``make test-replicas``): a moto S3 server, a writer and two replicas, each
a real `cloze serve` with its own index folder, each reaching the bucket through a proxy of its own that a
test can cut (or, the writer's, make lose the bucket's answers). One cluster serves the module's tests in
order (1)-(8); each leaves it converged."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.crashes import AUTH, Chain, Server, wait_ready
from harness.replication import MotoServer, TcpProxy, replication_env

STALE_AFTER_S = 3.0
WATCHDOG_S = 5.0
ACK_TIMEOUT_S = 3.0
WRITER_ONLY_MODEL = "writer-only"
GC_AFTER_S = 2.0  # old versions' objects go within seconds (test 7)
FROZEN_STAGE = "replication-default"  # default's follower thread pauses here, once the test arms it (test 8)


def volume(work: Path, name: str) -> dict[str, str]:
    """A host's own volume: its index folder and its collections' data root (unset, every process here would
    share ``work/collections``)."""
    return {"CLOZE_INDEX": str(work / name), "CLOZE_COLLECTIONS_DIR": str(work / f"{name}-collections")}


@dataclass
class Cluster:
    chain: Chain  # the writer, its ledger of acknowledged documents
    moto: MotoServer
    proxies: list[TcpProxy]  # replica ``number``'s way to the bucket
    writer_proxy: TcpProxy  # the writer's, whoever it is (a failover promotes a replica)
    replicas: list[Server] = field(default_factory=list)
    volumes: dict[int, str] = field(default_factory=dict)  # a replica's volume once a failover took the first
    writer_env: dict[str, str] = field(default_factory=dict)  # how the writer of the moment was started

    @property
    def writer(self) -> Server:
        assert self.chain.server is not None
        return self.chain.server

    def volume_of(self, number: int) -> str:
        return self.volumes.get(number, f"replica{number}")

    def replica_env(self, number: int) -> dict[str, str]:
        return {
            **volume(self.chain.work, self.volume_of(number)),
            "CLOZE_INDEX_PAUSE_AT": FROZEN_STAGE,  # fires only while the test arms it (test 8)
            **replication_env(
                "replica",
                self.proxies[number].url,
                poll_s="0.3",
                stale_after_s=str(STALE_AFTER_S),
                watchdog_s=str(WATCHDOG_S),
            ),
        }

    def start_replica(self, number: int) -> Server:
        server = self.chain.spawn(f"replica{number}", self.replica_env(number))
        wait_ready(server)
        if number < len(self.replicas):
            self.replicas[number] = server
        else:
            self.replicas.append(server)
        return server

    def start_writer(self, on: str = "writer", epoch: int = 1) -> Server:
        """A writer on volume ``on`` (a promoted replica's, after a failover) at ``epoch``."""
        env = replication_env(
            "writer",
            self.writer_proxy.url,
            epoch=str(epoch),
            poll_s="0.3",
            ack_timeout_s=str(ACK_TIMEOUT_S),
            gc_after_s=str(GC_AFTER_S),
        )
        # a second model the replicas lack: its collection is listed, and not followable there (test 10)
        env["CLOZE_MODELS"] = f"{WRITER_ONLY_MODEL}={self.chain.model}"
        self.writer_env = env | volume(self.chain.work, on)
        return self.chain.start("writer", self.writer_env)

    def restart_writer(self) -> Server:
        """The writer of the moment started again as it was (same volume, same epoch)."""
        self.chain.kill()
        return self.chain.start("writer", self.writer_env)

    # The faults of tests/replication/scenarios.py: a replica's proxy cut, the moto server stopped.
    def cut(self, number: int) -> None:
        self.proxies[number].cut()

    def heal(self, number: int) -> None:
        self.proxies[number].heal()

    def pause_bucket(self) -> None:
        self.moto.pause()

    def resume_bucket(self) -> None:
        self.moto.resume()


def replication(server: Server, collection: str = "default") -> dict[str, Any]:
    answer = httpx.get(server.url + "/readyz", headers=AUTH, timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()["collections"][collection]["replication"]


def documents(
    server: Server, filters: str | None = None, collection: str = "default"
) -> dict[str, tuple[str, dict]]:
    """Every document the server holds in ``collection`` (paged), id -> (text, metadata)."""
    found: dict[str, tuple[str, dict]] = {}
    cursor = None
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            if filters:
                params["filter"] = filters
            answer = http.get(f"/collections/{collection}/documents", params=params)
            assert answer.status_code == 200, answer.text
            page = answer.json()
            found |= {d["id"]: (d["text"], d["metadata"]) for d in page["documents"]}
            cursor = page["next_cursor"]
            if not cursor:
                return found


def wait_converged(
    cluster: Cluster,
    timeout: float = 30,
    replicas: list[Server] | None = None,
    collections: tuple[str, ...] = ("default",),
) -> float:
    """Seconds until every replica applied the writer's last sequence of the live version of each of
    ``collections``, the same incarnation."""
    started = time.monotonic()
    deadline = started + timeout
    last: list[dict] = []
    while time.monotonic() < deadline:
        last, done = [], True
        for name in collections:
            writer = replication(cluster.writer, name)  # {"waiting": ...} until its shipper starts
            last.append(writer)
            done = done and "version" in writer
            for server in replicas or cluster.replicas:
                with contextlib.suppress(httpx.HTTPError, AssertionError, KeyError):
                    state = replication(server, name)
                    last.append(state)
                    if [state.get(k) for k in ("version", "applied_seq", "incarnation")] == [
                        writer.get(k) for k in ("version", "seq", "incarnation")
                    ]:
                        continue
                done = False
        if done:
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"replicas did not converge in {timeout}s: {last}")


FIGURES: dict[str, list[float | dict | None]] = {}  # a fault scenario's record is a dict


@pytest.fixture
def record() -> Callable[[str, float | dict | None], None]:
    """Keep a figure or a record (each time a test runs); with REPLICA_RESULTS set they are written there as
    JSON."""

    def keep(name: str, value: float | dict | None) -> None:
        FIGURES.setdefault(name, []).append(round(value, 3) if isinstance(value, float | int) else value)
        if os.environ.get("REPLICA_RESULTS"):
            Path(os.environ["REPLICA_RESULTS"]).write_text(json.dumps(FIGURES, indent=2))

    return keep


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("replicas")
    moto = MotoServer(work / "moto.log")
    proxies = [TcpProxy(moto.port) for _ in range(3)]  # the replicas', then the writer's
    chain = Chain(root=work / "writer", model=tiny_bert, work=work)
    cluster = Cluster(chain, moto, proxies[:2], proxies[2])
    try:
        cluster.start_writer()
        for _ in range(5):
            assert chain.put(chain.new_docs(10)) == 200
        for number in range(2):
            cluster.start_replica(number)
        yield cluster
    finally:
        for server in [*cluster.replicas, chain.server]:
            if server is not None:
                server.kill()
        for proxy in proxies:
            proxy.close()
        moto.stop()
