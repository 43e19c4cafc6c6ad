"""What compose would run, run here: each cloze service's command line as `docker compose config`
resolves it from the compose file and an operator's .env, with the same `cloze` CLI and the same CLOZE_*
environment, its volumes swapped for temporary folders. (The gateway is stock nginx: not run here.)

The flow is the deployment's: the indexer builds the index volume, two api replicas serve it (and
should not write to it: compose mounts it read-only), a second batch build is picked up by both
replicas without a restart, and the trainer runs its recipe into the models volume.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.servers import free_port
from tests.deploy.conftest import BIN, REPO, compose_config

WRITE_KEY = "deploy-test-write-key"
KEYED = {"Authorization": f"Bearer {WRITE_KEY}"}  # once any key is set, reads need one too
DOCS = {
    "cats.txt": "The cat sat on the mat and played with a long piece of string.",
    "paris.txt": "Paris is the capital city of France, on the river Seine.",
    "music.txt": "The queen plays music on the guitar and reads a book.",
}
# Overrides appended to the trainer's command: the recipe's steps and sizes shrunk to a smoke run.
SMALLEST_RECIPE = (
    "--max-steps 2 --batch-size 4 --vocab-size 512 --hidden-size 64 --num-layers 1 --num-heads 2 "
    "--intermediate-size 128"
).split()
# The image's own ENV lines that the CLI relies on (compose adds the service environment on top).
IMAGE_ENV = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class Deployment:
    services: dict
    root: Path

    def mounts(self, name: str) -> dict[str, Path]:
        """Container path -> host folder: a named volume becomes root/volumes/<name>, a bind its source."""
        mounts = {}
        for volume in self.services[name].get("volumes", []):
            host = (
                Path(volume["source"])
                if volume["type"] == "bind"
                else self.root / "volumes" / volume["source"]
            )
            host.mkdir(parents=True, exist_ok=True)
            mounts[volume["target"]] = host
        return mounts

    def localize(self, name: str, value: str) -> str:
        for target, host in sorted(self.mounts(name).items(), key=lambda item: -len(item[0])):
            if value == target or value.startswith(target + "/"):
                return str(host) + value[len(target) :]
        return value

    def command(self, name: str, *extra: str) -> list[str]:
        return [
            str(BIN / "cloze"),
            *(self.localize(name, arg) for arg in self.services[name]["command"]),
            *extra,
        ]

    def env(self, name: str) -> dict[str, str]:
        base = {key: value for key, value in os.environ.items() if not key.startswith("CLOZE_")}
        service = {
            key: self.localize(name, str(value)) for key, value in self.services[name]["environment"].items()
        }
        return {**base, **IMAGE_ENV, "HOME": str(self.root / "home"), **service}

    def run(self, name: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self.command(name, *extra), env=self.env(name), capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Deployment:
    """An operator's project folder: .env from .env.example with keys, a model, documents and a corpus."""
    root = tmp_path_factory.mktemp("deploy")
    env = (REPO / ".env.example").read_text()
    for key, value in {
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_MODEL": "/models/tiny",
        "CLOZE_FILL_MASK_MODEL": "/models/tiny",  # it has an MLM head; spares each replica the default's load
        "CLOZE_DOCS": str(root / "docs"),
        "CLOZE_CORPUS": str(root / "corpus"),
    }.items():
        env = env.replace(f"\n{key}=", f"\n{key}={value}\n#{key}=", 1)
    (root / ".env").write_text(env)
    (root / "docs").mkdir()
    for name, text in DOCS.items():
        (root / "docs" / name).write_text(text)
    (root / "corpus").mkdir()
    paragraph = " ".join(list(DOCS.values()) * 4)  # ~160 tokens: the held-out split needs whole blocks
    (root / "corpus" / "prose.txt").write_text("\n\n".join([paragraph] * 60))
    (root / "home").mkdir()
    shutil.copytree(tiny_bert, root / "volumes" / "models" / "tiny")
    return Deployment(compose_config("all", root)[0]["services"], root)


@dataclass
class Replica:
    process: subprocess.Popen
    url: str
    log: Path

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


def start_api(deployment: Deployment, number: int) -> Replica:
    """`cloze serve --host 0.0.0.0 --port 8000` with the port swapped for a free one."""
    port = free_port()
    command = deployment.command("api")
    command[command.index("--port") + 1] = str(port)
    log = deployment.root / f"api-{number}.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            command, env=deployment.env("api"), stdout=handle, stderr=subprocess.STDOUT
        )
    return Replica(process, f"http://127.0.0.1:{port}", log)


def wait_until(replica: Replica, path: str, timeout: float) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        assert replica.process.poll() is None, f"api exited early:\n{replica.tail()}"
        try:
            response = httpx.get(replica.url + path, headers=KEYED, timeout=5)
            if response.status_code == 200 or time.monotonic() > deadline:
                return response
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"api never answered {path}:\n{replica.tail()}"
        time.sleep(0.3)


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@dataclass
class Serving:
    replicas: list[Replica]
    index: Path
    index_before: dict[str, tuple[int, int]]  # the index volume as the indexer left it


@pytest.fixture(scope="module")
def serving(deployment: Deployment) -> Iterator[Serving]:
    """`docker compose --profile batch run indexer`, then `up` with the compose file's replica count."""
    deployment.run("indexer")
    index = deployment.mounts("api")["/data/index"]
    assert any(index.iterdir()), "the indexer wrote nothing into the index volume"
    before = tree(index)
    count = deployment.services["api"]["deploy"]["replicas"]
    running = [start_api(deployment, number) for number in range(count)]
    try:
        for replica in running:
            ready = wait_until(replica, "/readyz", timeout=90)
            assert ready.status_code == 200, f"{ready.text}\n{replica.tail()}"
        yield Serving(running, index, before)
    finally:
        for replica in running:
            replica.process.terminate()
        for replica in running:
            replica.process.wait(timeout=20)


def test_replicas_serve_what_the_indexer_built(serving: Serving) -> None:
    assert len(serving.replicas) >= 2
    for replica in serving.replicas:
        found = httpx.get(replica.url + "/documents/paris.txt", headers=KEYED, timeout=10)
        assert found.status_code == 200 and "capital" in found.json()["text"], found.text


def test_replicas_leave_the_read_only_index_volume_untouched(serving: Serving) -> None:
    """Compose mounts the index read-only into the api: anything the api writes there would fail in Docker."""
    assert tree(serving.index) == serving.index_before


def test_replicas_refuse_writes_with_409(serving: Serving) -> None:
    """The read-only replicas answer every write endpoint with 409, before doing any work."""
    auth = {"Authorization": f"Bearer {WRITE_KEY}"}
    for replica in serving.replicas:
        answers = [
            httpx.put(
                replica.url + "/documents", json=[{"id": "x", "text": "new"}], headers=auth, timeout=10
            ),
            httpx.delete(replica.url + "/documents/paris.txt", headers=auth, timeout=10),
            httpx.post(replica.url + "/index/rebuild", headers=auth, timeout=10),
        ]
        assert [a.status_code for a in answers] == [409, 409, 409], [a.text for a in answers]
    assert tree(serving.index) == serving.index_before


def test_replicas_follow_a_batch_rebuild_without_restart(deployment: Deployment, serving: Serving) -> None:
    (deployment.root / "docs" / "river.txt").write_text("A long river runs to the sea past the city.")
    deployment.run("indexer")
    for replica in serving.replicas:
        found = wait_until(replica, "/documents/river.txt", timeout=20)
        assert found.status_code == 200, f"replica kept the old index version:\n{replica.tail()}"


def test_trainer_runs_its_recipe_into_the_models_volume(deployment: Deployment) -> None:
    deployment.run("trainer", *SMALLEST_RECIPE, timeout=240)
    out = Path(deployment.localize("trainer", deployment.services["trainer"]["command"][-1]))
    assert out.parent == deployment.mounts("trainer")["/models"]
    assert (out / "config.json").is_file(), sorted(p.name for p in out.iterdir())
