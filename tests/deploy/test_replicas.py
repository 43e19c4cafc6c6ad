"""Replication across hosts in Docker: docker-compose.yml's `replicas` profile run as a user runs it, with a
writer, two replicas and the S3 service each in its own container and volume, and every read and write
the tests send through the profile's gateway (or to one server's address on the `front` network).

Hosts and networks: the servers reach the bucket on the profile's `wan` network and the gateway on `front`,
so ``docker network disconnect <project>_wan replica-2`` cuts one replica off the bucket (test 4) while the
tests still reach it. `make test-deploy-replicas` runs this; `make test` deselects it (marker ``docker``).

Stand-ins (tests/deploy/images.py): the app image as test_stack.py builds it, and for MinIO and mc one
image with moto's S3 server and a small `mc`. Moto keeps its objects in memory: the profile's `s3` volume
holds nothing here, a limit of the stand-in, not of the profile (MinIO keeps them in that volume).

The tests run in order on one cluster; the figures go to test-artifacts/deploy/replicas.json and the
pytest summary. Tests 1, 2, 4, 5, 7 and 8 are the loopback tier's (tests/replication/scenarios.py) on this
cluster; 3 and 6 go through the real gateway.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.crashes import AUTH, KEY, Chain
from harness.servers import free_port
from tests.deploy import images
from tests.deploy.conftest import BIN, REPO
from tests.deploy.test_stack import IMAGE, wait_ready
from tests.replication import scenarios
from tests.replication.conftest import FROZEN_STAGE, documents, replication, wait_converged

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

PROJECT = "cloze-replicas-e2e"
STALE_AFTER_S = 3.0
WATCHDOG_S = 5.0
ACK_TIMEOUT_S = 3.0
CUT_S = 30.0
SEARCHES_DURING_KILL = 1000
# The test's own settings, appended to the operator's .env (which every cloze container reads): short
# replication periods, and the pause hook of test 8, armed only by a file the test creates in one container.
TEST_ENV = {
    "CLOZE_API_KEYS": KEY,
    "CLOZE_API_CPUS": "1",
    "CLOZE_THREADS": "1",
    "CLOZE_REPLICATION_POLL_S": "0.3",
    "CLOZE_REPLICATION_STALE_AFTER_S": str(STALE_AFTER_S),
    "CLOZE_REPLICATION_WATCHDOG_S": str(WATCHDOG_S),
    "CLOZE_REPLICATION_ACK_TIMEOUT_S": str(ACK_TIMEOUT_S),
    "AWS_ACCESS_KEY_ID": "cloze-test",
    "AWS_SECRET_ACCESS_KEY": "cloze-test-secret",
    "CLOZE_INDEX_PAUSE_AT": FROZEN_STAGE,
    "CLOZE_INDEX_PAUSE_FILE": "/tmp/cloze.paused",
    "CLOZE_INDEX_PAUSE_ARMED_BY": "/tmp/cloze.armed",
    "CLOZE_INDEX_PAUSE_SECONDS": "120",
}
RESULT: dict = {"stages": {}, "checks": {}}


@dataclass
class Node:
    """One server as the loopback helpers address it (they read ``url`` only), and its container."""

    container: str
    url: str = ""


@dataclass
class Cluster:
    project: Path
    gateway: str
    writer: Node
    replicas: list[Node]
    chain: Chain  # the ledger of acknowledged documents; it writes through the gateway
    s3: str = ""  # the S3 container
    cut_took_s: float = 0.0  # how long the last `docker network disconnect` took

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(BIN / "docker-compose"), "-p", PROJECT, "-f", str(REPO / "docker-compose.yml")]
        command += ["--project-directory", str(self.project), "--profile", "replicas", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        assert not check or result.returncode == 0, (
            f"compose {args}:\n{result.stdout[-3000:]}{result.stderr[-5000:]}"
        )
        return result

    # The faults of tests/replication/scenarios.py: a replica off the bucket's network, the bucket paused.
    def cut(self, number: int) -> None:
        started = time.monotonic()
        images.docker("network", "disconnect", f"{PROJECT}_wan", self.replicas[number].container)
        self.cut_took_s = round(time.monotonic() - started, 2)

    def heal(self, number: int) -> None:
        images.docker("network", "connect", f"{PROJECT}_wan", self.replicas[number].container)

    def pause_bucket(self) -> None:
        images.docker("pause", self.s3)

    def resume_bucket(self) -> None:
        images.docker("unpause", self.s3)

    def exec(self, node: Node, *command: str) -> None:
        images.docker("exec", node.container, *command)

    def address(self, node: Node, timeout: float = 60) -> str:
        """The server's URL on `front` (a restarted container may take a moment to get its address)."""
        network = f"{PROJECT}_front"
        deadline = time.monotonic() + timeout
        template = f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}'
        while not (ip := inspect(node.container, template)) or ip == "<no value>":
            assert time.monotonic() < deadline, f"{node.container} has no address on {network}"
            time.sleep(0.1)
        node.url = f"http://{ip}:8000"
        return node.url


def inspect(container: str, template: str) -> str:
    return images.docker("inspect", "-f", template, container).stdout.strip()


def container(service: str) -> str:
    ids = images.docker(
        "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}",
        "--filter", f"label=com.docker.compose.service={service}",
    ).stdout.split()  # fmt: skip
    assert len(ids) == 1, f"{service}: {ids}"
    return inspect(ids[0], "{{.Name}}").lstrip("/")


def operator_folder(folder: Path, gateway_port: int, bases: dict[str, str], s3_image: str) -> None:
    """.env from .env.example with the test's images and settings; docker/ for the gateway's config."""
    (folder / "docker").symlink_to(REPO / "docker")
    settings = {
        **TEST_ENV,
        "CLOZE_IMAGE": IMAGE,
        "CLOZE_GATEWAY_IMAGE": bases["nginx"],
        "CLOZE_S3_IMAGE": s3_image,
        "CLOZE_S3_CLIENT_IMAGE": s3_image,
        "CLOZE_REPLICAS_PORT": f"127.0.0.1:{gateway_port}",
        "CLOZE_S3_PORT": f"127.0.0.1:{free_port()}",
    }
    lines = (REPO / ".env.example").read_text().splitlines()
    kept = [line for line in lines if line.split("=", 1)[0] not in settings]
    (folder / ".env").write_text("\n".join([*kept, *(f"{k}={v}" for k, v in settings.items())]) + "\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Images, an operator's folder, `docker compose --profile replicas up`, 50 documents written."""
    images.docker("info")
    stages = RESULT["stages"]
    RESULT["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    bases = images.base_images(stages)
    s3_image = images.s3_image(bases["python"], stages)
    images.cpu_image(IMAGE, bases["python"], stages)
    work = tmp_path_factory.mktemp("replicas-operator")
    gateway_port = free_port()
    operator_folder(work, gateway_port, bases, s3_image)
    chain = Chain(root=work / "unused", model=work / "unused", work=work)
    cluster = Cluster(work, f"http://127.0.0.1:{gateway_port}", Node(""), [], chain)
    cluster.compose("down", "-v", "--remove-orphans", check=False)  # leftovers of an interrupted run
    try:
        started = time.monotonic()
        cluster.compose(
            "up", "-d", "--no-build", "--wait", "--wait-timeout", "400", "replicas-gateway", timeout=480
        )
        stages["compose_up_until_healthy"] = {"seconds": round(time.monotonic() - started, 1)}
        cluster.writer = Node(container("writer"))
        cluster.replicas = [Node(container(f"replica-{n}")) for n in (1, 2)]
        cluster.s3 = container("s3")
        for node in [cluster.writer, *cluster.replicas]:
            cluster.address(node)
        wait_ready(cluster.writer.url, 180, AUTH)
        chain.server = Node("gateway", cluster.gateway)  # type: ignore[assignment]  # writes use .url only
        for _ in range(5):
            assert chain.put(chain.new_docs(10)) == 200
        for node in cluster.replicas:
            wait_ready(node.url, 180, AUTH)
        stages["first_copy_on_both_replicas"] = {"seconds": round(time.monotonic() - started, 1)}
        yield cluster
    finally:
        images.ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (images.ARTIFACTS / "replicas-compose-logs.txt").write_text(
            cluster.compose("logs", "--no-color", "--tail", "80", check=False).stdout[-20000:]
        )
        cluster.compose("down", "-v", "--remove-orphans", timeout=180, check=False)
        (images.ARTIFACTS / "replicas.json").write_text(json.dumps(RESULT, indent=2) + "\n")


def test_1_replicas_answer_as_the_writer_after_bootstrap(cluster: Cluster) -> None:
    seconds = scenarios.replicas_answer_as_the_writer(cluster, expected_documents=50)
    RESULT["checks"]["1_bootstrap"] = {"documents": 50, "converged_s": round(seconds, 2)}


def test_2_two_clients_upsert_100_batches_and_every_replica_has_them(cluster: Cluster) -> None:
    """Through the gateway. Searchable: each new document is in its own top 5 (hybrid) on every replica."""
    figures = scenarios.two_clients_upsert_100_batches(cluster)
    new = figures.pop("new")
    for replica in cluster.replicas:
        with ThreadPoolExecutor(4) as pool:
            found = list(
                pool.map(lambda text, r=replica: scenarios.search_ids(r, text, "hybrid"), new.values())
            )
        missing = [doc_id for doc_id, hits in zip(new, found, strict=True) if doc_id not in hits]
        assert not missing, f"{replica.container}: not in its own top 5: {missing[:5]}"
    RESULT["checks"]["2_two_writers_100_batches"] = {
        "batches": 100,
        "searched_per_replica": len(new),
        **figures,
    }


def test_3_a_replica_killed_under_1000_searches_through_the_gateway(cluster: Cluster) -> None:
    """SIGKILL of the replica's main process from the host (a crash: the restart policy brings it back;
    `docker kill` would count as a stop by hand, which `unless-stopped` respects)."""
    victim = cluster.replicas[0]
    restarts = int(inspect(victim.container, "{{.RestartCount}}"))
    texts = list(cluster.chain.acked.values())
    failures: list[str] = []
    stop = threading.Event()

    def search(text: str) -> None:
        try:
            answer = httpx.get(
                cluster.gateway + "/search", params={"q": text, "top_k": 3}, headers=AUTH, timeout=30
            )
            if answer.status_code != 200 or not answer.json()["results"]:
                failures.append(f"{answer.status_code} {answer.text[:200]}")
        except httpx.HTTPError as exc:
            failures.append(repr(exc))

    def write_meanwhile() -> None:
        while not stop.is_set():
            cluster.chain.put(cluster.chain.new_docs(3))
            time.sleep(0.2)

    writes = threading.Thread(target=write_meanwhile, daemon=True)
    writes.start()
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(4) as clients:
            list(clients.map(search, random.choices(texts, k=SEARCHES_DURING_KILL // 5)))
            subprocess.run(["kill", "-9", inspect(victim.container, "{{.State.Pid}}")], check=True)
            killed = time.monotonic()
            list(clients.map(search, random.choices(texts, k=SEARCHES_DURING_KILL * 4 // 5)))
        load_s = time.monotonic() - started
    finally:
        stop.set()
        writes.join(timeout=60)
    assert not failures, f"{len(failures)} failed searches, e.g. {failures[:5]}"
    deadline = killed + 180
    while int(inspect(victim.container, "{{.RestartCount}}")) == restarts:
        assert time.monotonic() < deadline, f"{victim.container} was not restarted"
        time.sleep(0.1)
    wait_ready(cluster.address(victim), 180, AUTH)
    ready = time.monotonic() - killed
    converged = wait_converged(cluster, timeout=60)
    assert documents(victim) == documents(cluster.writer)
    RESULT["checks"]["3_replica_killed_under_searches"] = {
        "searches": SEARCHES_DURING_KILL,
        "failures": len(failures),
        "load_s": round(load_s, 1),
        "ready_after_kill_s": round(ready, 1),
        "converged_after_ready_s": round(converged, 2),
    }


def test_4_a_replica_cut_off_the_network_serves_flags_stale_and_converges(cluster: Cluster) -> None:
    """Replica 2 disconnected from `wan` (the bucket's network) for 30 s; the tests still reach it on `front`."""
    figures = scenarios.a_replica_cut_off(cluster, 1, CUT_S, STALE_AFTER_S)
    RESULT["checks"]["4_replica_cut_30_s"] = {
        "cut_s": CUT_S,
        "stale_after_s": STALE_AFTER_S,
        "disconnect_command_s": cluster.cut_took_s,
        **figures,
    }


def test_7_a_rebuild_and_a_restore_reach_the_replicas(cluster: Cluster) -> None:
    """Through the gateway: the rebuild, its job, the snapshot and the restore all reach the writer."""
    RESULT["checks"]["7_rebuild_and_restore"] = scenarios.a_rebuild_and_a_restore(cluster)


def test_8_a_frozen_follower_is_restarted_by_the_watchdog(cluster: Cluster) -> None:
    """The follower's pause point (``index.faultpoints``, stage `replication-default`) armed in replica 1's
    container only: restarted by test 3, it has not paused in this process yet."""
    frozen = cluster.replicas[0]

    def paused_at() -> str:
        return images.docker("exec", frozen.container, "cat", "/tmp/cloze.paused", check=False).stdout

    try:
        figures = scenarios.a_frozen_follower(
            cluster, frozen, WATCHDOG_S, lambda: cluster.exec(frozen, "touch", "/tmp/cloze.armed"), paused_at
        )
    finally:
        cluster.exec(frozen, "rm", "-f", "/tmp/cloze.armed", "/tmp/cloze.paused")
    RESULT["checks"]["8_frozen_follower"] = {"watchdog_s": WATCHDOG_S, **figures}


def test_5_a_paused_bucket_stops_remote_acks_not_local_writes(cluster: Cluster) -> None:
    """`docker pause` of the S3 container: its connections stay open and nothing answers."""
    figures = scenarios.a_paused_bucket(cluster, ACK_TIMEOUT_S)
    RESULT["checks"]["5_bucket_paused"] = {"local_write": 200, "remote_write": 503, **figures}


def test_6_the_writer_killed_reads_go_on(cluster: Cluster) -> None:
    """`docker kill`: a stop by hand, so the restart policy leaves the writer down."""
    wait_converged(cluster)
    images.docker("kill", cluster.writer.container)
    statuses: Counter[int] = Counter()
    texts = list(cluster.chain.acked.values())
    targets = [cluster.gateway, *(replica.url for replica in cluster.replicas)]
    for _ in range(60):
        for url in targets:
            answer = httpx.get(url + "/search", params={"q": random.choice(texts)}, headers=AUTH, timeout=10)
            statuses[answer.status_code] += 1
            statuses[httpx.get(url + "/documents/doc-1", headers=AUTH, timeout=10).status_code] += 1
    time.sleep(2)
    ages = []
    for replica in cluster.replicas:
        state = replication(replica)
        assert state["writer_heartbeat_age_s"] > 1.5, state
        ages.append(state["writer_heartbeat_age_s"])
    assert statuses == {200: 60 * len(targets) * 2}, statuses
    refused = httpx.put(
        cluster.gateway + "/documents", json=cluster.chain.new_docs(1), headers=AUTH, timeout=30
    )
    assert refused.status_code >= 500, refused.text  # no writer: the gateway has nowhere to send it
    RESULT["checks"]["6_writer_killed"] = {
        "reads": sum(statuses.values()),
        "statuses": dict(statuses),
        "writer_heartbeat_age_s": ages,
        "write_without_writer": refused.status_code,
    }
