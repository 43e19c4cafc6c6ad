"""A collection's identity on a real server: a deleted collection's snapshots do not pass to the next one of
its name, a delete never closes an index under a write or a restore in flight (it waits, then refuses with
409), and creates and deletes of one name from four threads never answer 500. On the tiny random model, with
the service's pause points holding an upsert and a restore in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import running_server


@pytest.fixture(scope="module")
def lifecycle_server(tiny_bert, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("lifecycle")
    env = {
        "CLOZE_MODEL": str(tiny_bert),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_BACKEND": "torch",
        "CLOZE_INDEX": str(root / "index"),
        "CLOZE_DELETE_WAIT_S": "1",
        "CLOZE_INDEX_PAUSE_AT": "upsert,restore",
        "CLOZE_INDEX_PAUSE_FILE": str(root / "paused"),
        "CLOZE_INDEX_PAUSE_ARMED_BY": str(root / "armed"),
    }
    with running_server(env, root / "server.log") as url:
        yield url, root


@pytest.fixture
def http(lifecycle_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lifecycle_server[0], timeout=60) as client:
        yield client


def test_a_deleted_collections_snapshots_do_not_pass_to_the_next_of_its_name(http):
    assert http.post("/collections", json={"name": "reborn"}).status_code == 201
    assert (
        http.put("/collections/reborn/documents", json=[{"id": "old", "text": "old data"}]).status_code == 200
    )
    snapshot = http.post("/collections/reborn/snapshots").json()["name"]
    assert http.delete("/collections/reborn").status_code == 200
    assert http.post("/collections", json={"name": "reborn"}).status_code == 201
    assert http.get("/collections/reborn/snapshots").json()["snapshots"] == []
    assert http.post(f"/collections/reborn/snapshots/{snapshot}/restore").status_code == 404
    assert http.get("/collections/reborn/documents/old").status_code == 404


def hold_in_flight(root: Path, call) -> tuple[threading.Thread, dict]:
    """Run ``call`` in a thread and wait until the server pauses inside it (at an armed pause point)."""
    (root / "armed").touch()
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.setdefault("response", call()))
    thread.start()
    deadline = time.monotonic() + 60
    while not (root / "paused").exists():
        assert time.monotonic() < deadline, "the request never reached its pause point"
        time.sleep(0.05)
    (root / "armed").unlink()
    return thread, answer


@pytest.mark.parametrize("kind", ["upsert", "restore"])
def test_delete_refuses_while_a_write_is_in_flight_and_never_pulls_the_floor(http, lifecycle_server, kind):
    root = lifecycle_server[1]
    name = f"busy-{kind}"
    assert http.post("/collections", json={"name": name}).status_code == 201
    assert http.put(f"/collections/{name}/documents", json=[{"id": "a", "text": "first"}]).status_code == 200
    snapshot = http.post(f"/collections/{name}/snapshots").json()["name"]
    late = [{"id": "late", "text": "written while a delete was asked for"}]
    with httpx.Client(base_url=lifecycle_server[0], timeout=60) as other:
        if kind == "upsert":
            thread, answer = hold_in_flight(
                root, lambda: other.put(f"/collections/{name}/documents", json=late)
            )
        else:
            path = f"/collections/{name}/snapshots/{snapshot}/restore"
            thread, answer = hold_in_flight(root, lambda: other.post(path))
        refused = http.delete(f"/collections/{name}")  # waits 1 s (CLOZE_DELETE_WAIT_S), then refuses
        assert refused.status_code == 409 and "still running" in refused.json()["error"], refused.text
        assert http.get(f"/collections/{name}").status_code == 200  # still served
        (root / "paused").unlink()
        thread.join(60)
    assert answer["response"].status_code == 200, answer["response"].text
    assert http.delete(f"/collections/{name}").status_code == 200
    assert not (root / "collections" / name).exists()  # a restore did not bring the folder back
    assert http.get(f"/collections/{name}").status_code == 404
    assert http.post("/collections", json={"name": name}).status_code == 201
    assert http.get(f"/collections/{name}").json()["documents"] == 0  # nothing committed into the new one
    assert http.delete(f"/collections/{name}").status_code == 200


def test_create_and_delete_of_one_name_from_four_threads_never_answer_500(lifecycle_server):
    url = lifecycle_server[0]

    def churn(worker: int) -> list[int]:
        with httpx.Client(base_url=url, timeout=60) as client:
            return [
                (
                    client.post("/collections", json={"name": "churn"})
                    if (worker + i) % 2
                    else client.delete("/collections/churn")
                ).status_code
                for i in range(12)
            ]

    with ThreadPoolExecutor(4) as pool:
        statuses = [status for answers in pool.map(churn, range(4)) for status in answers]
    assert set(statuses) <= {200, 201, 404, 409} and 201 in statuses and 200 in statuses, statuses
