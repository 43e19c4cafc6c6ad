"""The deployment for real: the CPU image built from docker/Dockerfile, the compose stack started with
docker-compose.yml, and every request sent through the gateway's host port (or, to check each replica
on its own, to that replica's address on the stack's compose network).

`make test-deploy` runs this (it installs and starts the engine first); `make test` deselects it by
the `docker` marker. Local stand-ins replace the images a user pulls: see tests/deploy/images.py.
The figures (stage times, image sizes, each check's numbers) go to test-artifacts/deploy/stack.json.

The tests run in file order against one stack: each step is the state the next one starts from.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness.servers import free_port
from tests.deploy import images
from tests.deploy.conftest import BIN, REPO

# On a fresh machine the first test waits for the base images and the CPU image to be built.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

PROJECT = "cloze-e2e"
IMAGE = "cloze-search:test-cpu"
WRITE_KEY = "deploy-stack-write-key"
KEYED = {"Authorization": f"Bearer {WRITE_KEY}"}  # once any key is set, reads need one too
REPLICAS = 2
DOCS_V1 = {
    "cats.txt": "The cat sat on the mat and played with a long piece of string.",
    "paris.txt": "Paris is the capital city of France, on the river Seine.",
    "music.txt": "The queen plays music on the guitar and reads a book.",
}
# Version 2: one document gone, one changed, one new.
DOCS_V2 = {
    "paris.txt": DOCS_V1["paris.txt"],
    "music.txt": "A violin concerto was played by the orchestra in the evening.",
    "river.txt": "A long river runs through the valley down to the sea.",
}
# The second collection's documents (embedded by the model the trainer makes in test 4).
DOCS_SECOND = {
    "lighthouse.txt": "The lighthouse lamp turns all night to warn the ships off the rocks.",
    "bakery.txt": "The bakery sells warm bread and pastries every morning.",
}
# What /search must answer: query -> the expected first document, per version.
QUERIES_V1 = {"capital of France": "paris.txt", "a cat playing with string": "cats.txt"}
QUERIES_V2 = {"capital of France": "paris.txt", "a river flowing to the sea": "river.txt"}
# Appended to the trainer's own command: the tiny-cpu recipe shrunk to a smoke run.
SMALLEST_RECIPE = (
    "--max-steps 2 --batch-size 4 --vocab-size 512 --hidden-size 64 --num-layers 1 --num-heads 2 "
    "--intermediate-size 128"
).split()
SEARCHES_DURING_CRASH = 1000
RELOAD_DEADLINE_S = 5.0
RESULT: dict = {"stages": {}, "images_mb": {}, "checks": {}}


def compose(
    stack: Stack, *args: str, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess:
    command = [
        str(BIN / "docker-compose"),
        "-p",
        PROJECT,
        "-f",
        str(REPO / "docker-compose.yml"),
        "--project-directory",
        str(stack.project),
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, (
            f"docker compose {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result


def docker(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return images.docker(*args, **kwargs)


def inspect(container: str, template: str) -> str:
    return docker("inspect", "-f", template, container).stdout.strip()


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder with its size and mtime: a write anywhere changes it."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@dataclass
class Stack:
    project: Path  # the operator's folder: .env, docs/, corpus/, and docker/ (nginx.conf) beside them
    gateway: str = ""
    index_volume: Path = Path()
    started: dict[str, str] = field(default_factory=dict)  # replica -> State.StartedAt at first start
    index_after_v2: dict = field(default_factory=dict)  # the index volume as the second indexer left it

    def containers(self, service: str, *, all_states: bool = False) -> list[str]:
        args = ["ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"]
        args += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = docker(*args, *(["-a"] if all_states else [])).stdout.split()
        return sorted(inspect(cid, "{{.Name}}").lstrip("/") for cid in ids)

    def replica_url(self, name: str, timeout: float = 30) -> str:
        # A container that has just been restarted reports Running a moment before the network gives it
        # an address again (seen in CI): wait for the address instead of failing on the first look.
        deadline = time.monotonic() + timeout
        while not (address := inspect(name, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")):
            assert time.monotonic() < deadline, f"{name} has no address on the compose network"
            time.sleep(0.1)
        return f"http://{address}:8000"

    def logs(self) -> str:
        return compose(self, "logs", "--no-color", "--tail", "60", check=False).stdout[-8000:]


def write_docs(folder: Path, docs: dict[str, str]) -> None:
    for old in folder.glob("*.txt"):
        old.unlink()
    for name, text in docs.items():
        (folder / name).write_text(text)


def index_version(stack: Stack) -> int:
    return int((stack.index_volume / "CURRENT").read_text().strip())


def run_indexer(stack: Stack) -> dict:
    started = time.monotonic()
    result = compose(stack, "--profile", "batch", "run", "--rm", "-T", "indexer", timeout=900)
    manifest = json.loads(result.stdout.strip().splitlines()[-1])
    return {"seconds": round(time.monotonic() - started, 1), "manifest": manifest}


def wait_ready(url: str, timeout: float, headers: dict[str, str] = KEYED) -> float:
    started = time.monotonic()
    deadline = started + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url + "/readyz", headers=headers, timeout=5)
            if response.status_code == 200:
                return round(time.monotonic() - started, 2)
            last = f"{response.status_code} {response.text}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.25)
    raise AssertionError(f"{url} not ready after {timeout} s: {last}")


def top_hit(url: str, query: str) -> str | None:
    response = httpx.get(url + "/search", params={"q": query, "top_k": 3}, headers=KEYED, timeout=30)
    assert response.status_code == 200, f"{url} /search {query!r}: {response.status_code} {response.text}"
    results = response.json()["results"]
    return results[0]["id"] if results else None


def write_stack_result() -> None:
    images.ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (images.ARTIFACTS / "stack.json").write_text(json.dumps(RESULT, indent=2) + "\n")


def _engine_stage() -> None:
    """`make test-deploy` notes when it began installing/starting the engine and when it answered."""
    try:
        began, ready = (float((images.ARTIFACTS / n).read_text()) for n in ("engine-started", "engine-ready"))
    except (FileNotFoundError, ValueError):
        return
    RESULT["stages"]["engine"] = {"seconds": round(ready - began, 1)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Base images, the CPU image, an operator's folder; after the last test, `docker compose down -v`."""
    docker("info")  # an engine answers (make test-deploy starts one)
    _engine_stage()
    stages = RESULT["stages"]
    RESULT["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    RESULT["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    bases = images.base_images(stages)
    images.cpu_image(IMAGE, bases["python"], stages)
    RESULT["images_mb"] = {
        "cloze-search (CPU)": images.image_size_mb(IMAGE),
        "python stand-in": images.image_size_mb(bases["python"]),
        "nginx stand-in": images.image_size_mb(bases["nginx"]),
    }
    project = tmp_path_factory.mktemp("operator")
    (project / "docker").symlink_to(REPO / "docker")  # the compose file mounts ./docker/nginx.conf
    (project / "docs").mkdir()
    write_docs(project / "docs", DOCS_V1)
    (project / "corpus").mkdir()
    paragraph = " ".join(list(DOCS_V1.values()) * 4)  # the held-out split needs whole blocks
    (project / "corpus" / "prose.txt").write_text("\n\n".join([paragraph] * 60))
    gateway_port = free_port()
    env = (REPO / ".env.example").read_text()
    for key, value in {
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_PORT": f"127.0.0.1:{gateway_port}",
        "CLOZE_REPLICAS": str(REPLICAS),
        "CLOZE_IMAGE": IMAGE,
        "CLOZE_GATEWAY_IMAGE": bases["nginx"],
        "CLOZE_DOCS": str(project / "docs"),
        "CLOZE_CORPUS": str(project / "corpus"),
        # two replicas and the jobs share this machine's two cores
        "CLOZE_API_CPUS": "1",
        "CLOZE_THREADS": "1",
        "CLOZE_BATCH_CPUS": "2",
    }.items():
        assert f"\n{key}=" in env, f"{key} is not in .env.example"
        env = env.replace(f"\n{key}=", f"\n{key}={value}\n#{key}=", 1)
    (project / ".env").write_text(env)
    stack = Stack(project, gateway=f"http://127.0.0.1:{gateway_port}")
    compose(stack, "down", "-v", "--remove-orphans", check=False)  # leftovers of an interrupted run
    try:
        yield stack
    finally:
        (images.ARTIFACTS / "compose-logs.txt").write_text(stack.logs())
        compose(stack, "down", "-v", "--remove-orphans", check=False)
        write_stack_result()


def test_1_indexer_builds_the_first_index_and_the_replicas_serve_it(stack: Stack) -> None:
    indexed = run_indexer(stack)
    volume = docker("volume", "inspect", "-f", "{{.Mountpoint}}", f"{PROJECT}_index").stdout.strip()
    stack.index_volume = Path(volume)
    assert index_version(stack) == 1 and indexed["manifest"]["documents"] == len(DOCS_V1)

    started = time.monotonic()
    compose(stack, "up", "-d", "--no-build", "--wait", "--wait-timeout", "300", timeout=420)
    up_seconds = round(time.monotonic() - started, 1)
    replicas = stack.containers("api")
    assert len(replicas) == REPLICAS, replicas
    answers = {}
    for name in replicas:
        url = stack.replica_url(name)
        wait_ready(url, timeout=120)
        assert inspect(name, "{{.State.Health.Status}}") == "healthy"
        answers[name] = {query: top_hit(url, query) for query in QUERIES_V1}
        stack.started[name] = inspect(name, "{{.State.StartedAt}}")
    through_gateway = {query: top_hit(stack.gateway, query) for query in QUERIES_V1}
    assert through_gateway == QUERIES_V1, through_gateway
    for name, answer in answers.items():
        assert answer == QUERIES_V1, f"{name}: {answer}"
    RESULT["stages"]["indexer_v1"] = {"seconds": indexed["seconds"]}
    RESULT["stages"]["compose_up_until_healthy"] = {"seconds": up_seconds}
    RESULT["checks"]["1_first_index"] = {
        "index_version": 1,
        "documents": indexed["manifest"]["documents"],
        "replicas_healthy": len(replicas),
        "gateway_top_hits": through_gateway,
    }


def test_5a_replicas_run_as_10001_read_only_and_refuse_writes(stack: Stack) -> None:
    before = tree(stack.index_volume)
    refused = {}
    for name in stack.containers("api"):
        assert inspect(name, "{{.Config.User}}") == "10001:10001"
        pid = inspect(name, "{{.State.Pid}}")
        uids = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split("\n")[0].split()
        assert set(uids) == {"10001"}, f"{name} main process runs as {uids}"
        assert docker("exec", name, "id", "-u").stdout.strip() == "10001"
        mounts = json.loads(inspect(name, "{{json .Mounts}}"))
        index_mount = next(m for m in mounts if m["Destination"] == "/data/index")
        assert index_mount["RW"] is False
        assert inspect(name, "{{.State.Health.Status}}") == "healthy"
        url = stack.replica_url(name)
        auth = {"Authorization": f"Bearer {WRITE_KEY}"}
        writes = {
            "PUT /documents": httpx.put(
                url + "/documents", json=[{"id": "x", "text": "new"}], headers=auth, timeout=30
            ),
            "DELETE /documents/paris.txt": httpx.delete(
                url + "/documents/paris.txt", headers=auth, timeout=30
            ),
            "POST /index/rebuild": httpx.post(url + "/index/rebuild", headers=auth, timeout=30),
        }
        refused[name] = {what: response.status_code for what, response in writes.items()}
        assert set(refused[name].values()) == {409}, {w: r.text for w, r in writes.items()}
        # a search, so the replica has done its reads while we watch the volume
        assert top_hit(url, "capital of France") == "paris.txt"
    via_gateway = httpx.put(
        stack.gateway + "/documents",
        json=[{"id": "x", "text": "new"}],
        headers={"Authorization": f"Bearer {WRITE_KEY}"},
        timeout=30,
    )
    assert via_gateway.status_code == 409, via_gateway.text
    assert tree(stack.index_volume) == before, "a replica wrote into the read-only index volume"
    assert httpx.get(stack.gateway + "/documents/x", headers=KEYED, timeout=10).status_code == 404
    RESULT["checks"]["5_user_health_read_only_409"] = {
        "uid": 10001,
        "health": "healthy",
        "index_mount_rw": False,
        "index_volume_unchanged": True,
        "write_status_per_replica": refused,
        "write_status_via_gateway": via_gateway.status_code,
    }


def test_2_second_indexer_run_reaches_every_replica_within_5_s(stack: Stack) -> None:
    write_docs(stack.project / "docs", DOCS_V2)
    replicas = {name: stack.replica_url(name) for name in stack.containers("api")}
    indexed = run_indexer(stack)
    published = time.monotonic()  # the indexer has exited: CURRENT names version 2
    assert index_version(stack) == 2 and indexed["manifest"]["documents"] == len(DOCS_V2)
    seen: dict[str, float] = {}
    while len(seen) < len(replicas) and time.monotonic() - published < 30:
        for name, url in replicas.items():
            if name in seen:
                continue
            try:
                river = httpx.get(url + "/documents/river.txt", headers=KEYED, timeout=5).status_code
            except httpx.TransportError:
                continue
            if river == 200:
                seen[name] = round(time.monotonic() - published, 2)
        time.sleep(0.05)
    assert set(seen) == set(replicas), f"replicas that never served version 2: {set(replicas) - set(seen)}"
    for name, url in replicas.items():
        assert seen[name] <= RELOAD_DEADLINE_S, f"{name} took {seen[name]} s"
        assert httpx.get(url + "/documents/cats.txt", headers=KEYED, timeout=5).status_code == 404, (
            "deleted doc served"
        )
        music = httpx.get(url + "/documents/music.txt", headers=KEYED, timeout=5).json()["text"]
        assert music == DOCS_V2["music.txt"]
        assert {q: top_hit(url, q) for q in QUERIES_V2} == QUERIES_V2
        assert inspect(name, "{{.RestartCount}}") == "0"
        assert inspect(name, "{{.State.StartedAt}}") == stack.started[name], f"{name} was restarted"
    stack.index_after_v2 = tree(stack.index_volume)
    RESULT["stages"]["indexer_v2"] = {"seconds": indexed["seconds"]}
    RESULT["checks"]["2_version_2_without_restart"] = {
        "index_version": 2,
        "seconds_until_served_per_replica": seen,
        "deadline_s": RELOAD_DEADLINE_S,
        "restarts": 0,
    }


def test_3_a_replica_crashes_during_1000_searches_without_a_failed_request(stack: Stack) -> None:
    """SIGKILL of the container's main process from the host: a crash. (`docker kill` would count as
    a stop by hand, after which `unless-stopped` never restarts the container.)"""
    victim = stack.containers("api")[0]
    restarts_before = int(inspect(victim, "{{.RestartCount}}"))
    queries = [f"{word} of France" for word in ("capital", "city", "river", "seine")] + list(QUERIES_V2)
    failures: list[str] = []
    latencies: list[float] = []
    done = threading.Event()
    lock = threading.Lock()
    count = {"sent": 0}

    def one(i: int) -> None:
        started = time.perf_counter()
        try:
            response = client.get("/search", params={"q": queries[i % len(queries)]})
            ok = response.status_code == 200 and response.json()["results"]
            if not ok:
                failures.append(f"{response.status_code} {response.text[:200]}")
        except httpx.HTTPError as exc:
            failures.append(repr(exc))
        with lock:
            latencies.append(time.perf_counter() - started)
            count["sent"] += 1
            if count["sent"] >= SEARCHES_DURING_CRASH // 5:
                done.set()

    recovery: dict[str, float | str] = {}  # seconds after the kill, watched while the searches run

    def crash() -> None:
        try:
            crash_and_watch()
        except Exception as exc:  # a thread's exception is otherwise lost: report it in the assertion
            recovery["error"] = repr(exc)

    def crash_and_watch() -> None:
        done.wait(120)  # a fifth of the searches have run: crash mid-load
        pid = inspect(victim, "{{.State.Pid}}")
        subprocess.run(["kill", "-9", pid], check=True)
        killed = recovery["killed_at"] = time.monotonic()
        deadline = killed + 180
        while (
            int(inspect(victim, "{{.RestartCount}}")) == restarts_before
            or inspect(victim, "{{.State.Running}}") != "true"
        ):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        recovery["restarted_after_s"] = round(time.monotonic() - killed, 2)
        wait_ready(stack.replica_url(victim), timeout=180)
        recovery["ready_after_s"] = round(time.monotonic() - killed, 2)

    with httpx.Client(base_url=stack.gateway, headers=KEYED, timeout=60) as client:
        crasher = threading.Thread(target=crash)
        crasher.start()
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(one, range(SEARCHES_DURING_CRASH)))
        load_seconds = time.monotonic() - started
        crasher.join()
    assert "killed_at" in recovery, "the replica was never crashed"
    assert not failures, f"{len(failures)} failed requests, e.g. {failures[:5]}"
    # back by the restart policy, ready, healthy and serving the current version
    assert "ready_after_s" in recovery, f"{victim} never came back ({recovery}):\n{stack.logs()}"
    deadline = time.monotonic() + 120
    while inspect(victim, "{{.State.Health.Status}}") != "healthy":
        assert time.monotonic() < deadline, f"{victim} restarted but never became healthy"
        time.sleep(0.5)
    healthy_after = round(time.monotonic() - recovery["killed_at"], 1)
    assert top_hit(stack.replica_url(victim), "a river flowing to the sea") == "river.txt"
    assert tree(stack.index_volume) == stack.index_after_v2, "the index volume changed under load/restart"
    latencies.sort()
    RESULT["checks"]["3_crash_during_load"] = {
        "searches": SEARCHES_DURING_CRASH,
        "concurrency": 8,
        "failed": len(failures),
        "seconds": round(load_seconds, 1),
        "requests_per_s": round(SEARCHES_DURING_CRASH / load_seconds, 1),
        "latency_p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "latency_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
        "latency_max_ms": round(latencies[-1] * 1000, 1),
        "crashed": victim,
        "how": "kill -9 of the container's main process (State.Pid) from the host",
        "restart_count": int(inspect(victim, "{{.RestartCount}}")),
        "killed_after_s_of_load": round(recovery["killed_at"] - started, 2),
        "restarted_after_s": recovery["restarted_after_s"],
        "ready_after_s": recovery["ready_after_s"],
        "healthy_after_s": healthy_after,
    }


def test_4_train_profile_runs_a_tiny_recipe_into_the_models_volume(stack: Stack) -> None:
    config = json.loads(compose(stack, "--profile", "train", "config", "--format", "json").stdout)
    command = config["services"]["trainer"]["command"]
    started = time.monotonic()
    result = compose(
        stack, "--profile", "train", "run", "--rm", "-T", "trainer", *command, *SMALLEST_RECIPE, timeout=900
    )
    seconds = round(time.monotonic() - started, 1)
    assert result.returncode == 0
    models = Path(docker("volume", "inspect", "-f", "{{.Mountpoint}}", f"{PROJECT}_models").stdout.strip())
    out = models / Path(command[command.index("--out") + 1]).relative_to("/models")
    assert (out / "config.json").is_file(), sorted(p.name for p in out.parent.rglob("*"))
    owners = {p.stat().st_uid for p in out.rglob("*")}
    assert owners == {10001}, f"trainer output owned by {owners}"
    RESULT["stages"]["trainer"] = {"seconds": seconds}
    RESULT["checks"]["4_train_profile"] = {
        "exit_code": 0,
        "output": str(out.relative_to(models)),
        "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
        "seconds": seconds,
    }


def test_4b_a_second_collection_on_a_second_model_through_the_gateway_and_each_replica(stack: Stack) -> None:
    """The collection-indexer builds `second` with the model the trainer made (a real folder of this
    project's, beside the bundled one); the api, re-created with it in CLOZE_MODELS, serves both collections."""
    (stack.project / "docs-second").mkdir(exist_ok=True)
    write_docs(stack.project / "docs-second", DOCS_SECOND)
    env = (stack.project / ".env").read_text()
    for key, value in {
        "CLOZE_MODELS": "default=<bundled>,second=/models/pretrained-mlm",
        "CLOZE_COLLECTION_DOCS": str(stack.project / "docs-second"),
        "CLOZE_COLLECTION_MODEL": "/models/pretrained-mlm",
        "CLOZE_COLLECTION_MODEL_NAME": "second",
        "CLOZE_BACKEND": "torch",  # the tiny trained model has no ONNX export; the bundled one runs as well
    }.items():
        assert f"\n{key}=" in env, f"{key} is not in .env.example"
        env = env.replace(f"\n{key}=", f"\n{key}={value}\n#{key}=", 1)
    (stack.project / ".env").write_text(env)
    started = time.monotonic()
    built = compose(stack, "--profile", "batch", "run", "--rm", "-T", "collection-indexer", timeout=900)
    manifest = json.loads(built.stdout.strip().splitlines()[-1])
    assert manifest["documents"] == len(DOCS_SECOND)
    compose(stack, "up", "-d", "--no-build", "--wait", "--wait-timeout", "300", timeout=420)
    seconds = round(time.monotonic() - started, 1)
    checked = {}
    for url in [stack.gateway, *(stack.replica_url(name) for name in stack.containers("api"))]:
        wait_ready(url, timeout=120)
        deadline = time.monotonic() + 30
        while (
            listing := httpx.get(url + "/collections", headers=KEYED, timeout=30).json()["collections"]
        ) and not any(entry["name"] == "second" and entry["status"] == "ready" for entry in listing):
            assert time.monotonic() < deadline, listing
            time.sleep(0.5)
        models = {entry["name"]: entry["model"] for entry in listing}
        assert models == {"default": "default", "second": "second"}, models
        default_hit = top_hit(url, "capital of France")
        answer = httpx.get(
            url + "/collections/second/search",
            params={"q": "lighthouse lamp", "mode": "bm25"},
            headers=KEYED,
            timeout=30,
        )
        second_hit = answer.json()["results"][0]["id"]
        assert (default_hit, second_hit) == ("paris.txt", "lighthouse.txt"), (url, default_hit, second_hit)
        dense = httpx.get(
            url + "/collections/second/search",
            params={"q": "lighthouse", "mode": "dense"},
            headers=KEYED,
            timeout=30,
        )
        assert {hit["id"] for hit in dense.json()["results"]} <= set(DOCS_SECOND)  # its own documents only
        checked[url] = {"default": default_hit, "second": second_hit}
    RESULT["stages"]["second_collection"] = {"seconds": seconds}
    RESULT["checks"]["4b_two_collections_two_models"] = {"collections": models, "top_hits": checked}


def test_5b_compose_down_v_leaves_nothing(stack: Stack) -> None:
    started = time.monotonic()
    compose(stack, "down", "-v", "--remove-orphans", timeout=180)
    label = f"label=com.docker.compose.project={PROJECT}"
    left = {
        "containers": docker("ps", "-aq", "--filter", label).stdout.split(),
        "volumes": docker("volume", "ls", "-q", "--filter", label).stdout.split(),
        "networks": docker("network", "ls", "-q", "--filter", label).stdout.split(),
        # the images this run's build replaced: each run would otherwise leave 2.4 GB behind
        "replaced images": [old for old in images.REPLACED if images.image_exists(old)],
    }
    assert not any(left.values()), left
    assert not stack.index_volume.exists()
    RESULT["stages"]["compose_down"] = {"seconds": round(time.monotonic() - started, 1)}
    RESULT["checks"]["5_down_leaves_nothing"] = {kind: len(ids) for kind, ids in left.items()}
    RESULT["total_test_seconds"] = round(
        sum(stage.get("seconds", 0) for stage in RESULT["stages"].values()), 1
    )
