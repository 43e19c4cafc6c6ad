"""Collections on a real server over a socket: two collections on two models (the bundled MiniLM and
the tiny random model, so a ranking says which model embedded it), keys scoped to collections, hostile names,
a delete under a load of searches, and SIGKILL in the middle of a create and of a delete."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from encoder_runtime import load_encoder
from tests.e2e.conftest import READ_KEY, WRITE_KEY, running_server, serve_process

PAPERS_KEY, NOTES_KEY = "papers-read-key-0123456789", "notes-write-key-0123456789"
PAPERS = [
    {"id": "p1", "text": "Vaccines train the immune system to recognise a virus.", "metadata": {"n": 1}},
    {"id": "p2", "text": "The central bank raised interest rates to slow inflation.", "metadata": {"n": 2}},
    {"id": "p3", "text": "A striker scored twice in the cup final on Sunday.", "metadata": {"n": 3}},
]
NOTES = [{"id": f"n{i}", "text": text} for i, text in enumerate(["red apples", "blue ocean", "green forest"])]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("collections")


@pytest.fixture(scope="module")
def service(tiny_bert, data_root, tmp_path_factory) -> Iterator[str]:
    env = {
        "CLOZE_INDEX": str(data_root / "index"),
        "CLOZE_COLLECTIONS_DIR": str(data_root / "collections"),
        "CLOZE_MODELS": f"default=<bundled>,tiny={tiny_bert}",
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_BACKEND": "torch",
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_READ_API_KEYS": READ_KEY,
        "CLOZE_COLLECTION_API_KEYS": f"{PAPERS_KEY}=read:papers,{NOTES_KEY}=write:notes",
        "CLOZE_MAX_COLLECTIONS": "6",
    }
    with running_server(env, tmp_path_factory.mktemp("collection-logs") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def admin(service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service, headers={"Authorization": f"Bearer {WRITE_KEY}"}, timeout=60) as http:
        yield http


@pytest.fixture(scope="module")
def two_collections(admin) -> None:
    assert admin.post("/collections", json={"name": "papers"}).status_code == 201
    created = admin.post("/collections", json={"name": "notes", "model": "tiny", "factory": "HNSW16"})
    assert created.status_code == 201, created.text
    assert created.json()["model"] == "tiny" and created.json()["status"] == "ready"
    assert admin.put("/collections/papers/documents", json=PAPERS).json()["upserted"] == 3
    assert admin.put("/collections/notes/documents", json=NOTES).json()["upserted"] == 3


def ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [hit["id"] for hit in answer.json()["results"]]


def test_two_collections_on_two_models(admin, two_collections, tiny_bert):
    query = {"query": "how do vaccines protect against viruses", "mode": "dense", "top_k": 3}
    assert ids(admin.post("/collections/papers/search", json=query))[0] == "p1"  # MiniLM's semantics
    # notes embeds with the tiny random model: its scores are the tiny model's cosines, computed here.
    tiny = load_encoder(str(tiny_bert), backend="torch")
    vectors = tiny.finish(list(tiny.embed([note["text"] for note in NOTES])), normalize=True)
    query = tiny.finish(list(tiny.embed(["blue sky"])), normalize=True)[0]
    expected = dict(zip([note["id"] for note in NOTES], (vectors @ query).tolist(), strict=True))
    answer = admin.post("/collections/notes/search", json={"query": "blue sky", "mode": "dense"}).json()
    got = {hit["id"]: hit["score"] for hit in answer["results"]}
    assert got.keys() == expected.keys()
    assert all(abs(got[key] - expected[key]) < 1e-4 for key in got)
    minilm = admin.post("/collections/papers/search", json={"query": "blue sky", "mode": "dense"}).json()
    assert max(hit["score"] for hit in minilm["results"]) < 0.5  # MiniLM's cosines there, not tiny's
    assert ids(admin.get("/collections/notes/search", params={"q": "ocean", "mode": "bm25"})) == ["n1"]
    # Each collection holds its own documents only; the old routes are the collection default.
    assert admin.get("/collections/papers/documents/n1").status_code == 404
    assert admin.get("/collections/notes/documents/n1").json()["text"] == "blue ocean"
    assert ids(admin.post("/search", json={"query": "vaccines", "mode": "bm25"})) == []
    shown = admin.get("/collections/notes").json()
    assert (shown["model"], shown["documents"], shown["factory"]) == ("tiny", 3, "HNSW16")
    assert shown["bytes_on_disk"] > 10_000 and shown["last_write"] and shown["version"] == 1
    listed = [entry["name"] for entry in admin.get("/collections").json()["collections"]]
    assert listed[0] == "default" and {"papers", "notes"} <= set(listed)
    fields = admin.get("/collections/papers/index/fields").json()
    assert fields["fields"] == ["n"] and fields["counts"]["documents"] == 3


def test_rebuild_and_jobs_belong_to_their_collection(admin, two_collections):
    job = admin.post("/collections/notes/index/rebuild").json()["job_id"]
    deadline = time.monotonic() + 60
    while (status := admin.get(f"/collections/notes/jobs/{job}").json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert status["status"] == "succeeded" and status["collection"] == "notes"
    assert admin.get(f"/collections/papers/jobs/{job}").status_code == 404
    assert admin.get("/collections/notes").json()["version"] == 2


def test_keys_scoped_to_collections(service, two_collections):
    def call(key: str, method: str, path: str, **kwargs) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.request(method, service + path, headers=headers, timeout=60, **kwargs).status_code

    search = {"json": {"query": "rates", "mode": "bm25"}}
    assert call(PAPERS_KEY, "POST", "/collections/papers/search", **search) == 200
    assert call(PAPERS_KEY, "POST", "/collections/notes/search", **search) == 403
    assert call(PAPERS_KEY, "POST", "/search", **search) == 403  # the old routes are the collection default
    assert call(PAPERS_KEY, "PUT", "/collections/papers/documents", json=PAPERS[:1]) == 403  # read only
    assert call(NOTES_KEY, "PUT", "/collections/notes/documents", json=NOTES[:1]) == 200  # write scope
    assert call(NOTES_KEY, "DELETE", "/collections/papers/documents/p1") == 403
    assert call(NOTES_KEY, "POST", "/collections", json={"name": "mine"}) == 403  # needs an unscoped key
    assert call(NOTES_KEY, "GET", "/metrics") == 403
    assert call(PAPERS_KEY, "POST", "/embed", json={"inputs": "model routes stay open"}) == 200
    assert call("no-such-key", "GET", "/collections") == 401
    listing = httpx.get(
        service + "/collections", headers={"Authorization": f"Bearer {PAPERS_KEY}"}, timeout=60
    ).json()
    assert [entry["name"] for entry in listing["collections"]] == ["papers"]


@pytest.mark.parametrize(
    "name",
    [
        "../etc",
        "a/b",
        "..",
        "Papers",
        "nul\x00",
        "tab\tname",
        "café",
        "pаpers",
        "ｐａｐｅｒｓ",
        "-x",
        "",
        "a" * 65,
    ],
)
def test_hostile_names_are_refused(admin, name):
    answer = admin.post("/collections", json={"name": name})
    assert answer.status_code == 422 and answer.json()["field"] == "name", answer.text


def test_conflicts_and_limits(admin, two_collections, data_root):
    assert admin.post("/collections", json={"name": "papers"}).status_code == 409
    unknown = admin.post("/collections", json={"name": "x1", "model": "no-such-model"})
    assert unknown.status_code == 404 and "served: default, tiny" in unknown.json()["error"]
    bad = admin.post("/collections", json={"name": "x1", "factory": "NotAFactory99"})
    assert bad.status_code == 422 and bad.json()["field"] == "factory"
    assert admin.post("/collections", json={"name": "x1", "chunk_window": 10_000}).status_code == 422
    assert admin.delete("/collections/default").status_code == 409
    assert admin.delete("/collections/never-made").status_code == 404
    assert admin.get("/collections/..%2Fetc/search", params={"q": "x"}).status_code in (404, 422)
    made = []
    while (answer := admin.post("/collections", json={"name": f"fill-{len(made)}"})).status_code == 201:
        made.append(answer.json()["name"])
    assert answer.status_code == 409 and "CLOZE_MAX_COLLECTIONS" in answer.json()["error"]
    for name in made:
        assert admin.delete(f"/collections/{name}").status_code == 200
    assert not [
        p
        for p in (data_root / "collections").iterdir()
        if p.name.startswith(("fill-", ".creating", ".deleting"))
    ]


def test_delete_while_searches_run_on_it_and_a_neighbour(admin, two_collections, data_root):
    assert admin.post("/collections", json={"name": "doomed"}).status_code == 201
    assert admin.put("/collections/doomed/documents", json=PAPERS).status_code == 200
    statuses: dict[str, list[int]] = {"doomed": [], "papers": []}
    stop = threading.Event()

    def load(name: str) -> None:
        with httpx.Client(base_url=str(admin.base_url), headers=admin.headers, timeout=60) as http:
            while not stop.is_set():
                body = {"query": "interest rates and inflation", "top_k": 2}
                statuses[name].append(http.post(f"/collections/{name}/search", json=body).status_code)

    workers = [
        threading.Thread(target=load, args=(name,)) for name in ("doomed", "papers", "doomed", "papers")
    ]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 120
    while statuses["doomed"].count(200) < 4 or statuses["papers"].count(200) < 4:  # the load is running
        assert time.monotonic() < deadline, statuses
        time.sleep(0.05)
    assert admin.delete("/collections/doomed").json() == {"deleted": "doomed"}
    after = len(statuses["papers"])
    while len(statuses["papers"]) < after + 4 or statuses["doomed"][-1] != 404:  # and goes on after
        assert time.monotonic() < deadline, statuses
        time.sleep(0.05)
    stop.set()
    for worker in workers:
        worker.join()
    assert statuses["papers"] and set(statuses["papers"]) == {200}  # the neighbour never noticed
    assert 200 in statuses["doomed"] and set(statuses["doomed"]) <= {200, 404}  # finished, or 404: no 5xx
    assert statuses["doomed"][-1] == 404
    assert not (data_root / "collections" / "doomed").exists()


@pytest.mark.parametrize("stage", ["collection-create", "collection-delete"])
def test_sigkill_during_create_or_delete_leaves_no_half_collection(stage, tmp_path):
    env = {
        "CLOZE_INDEX": str(tmp_path / "index"),
        "CLOZE_BACKEND": "torch",
        "CLOZE_INDEX_PAUSE_AT": stage,
        "CLOZE_INDEX_PAUSE_FILE": str(tmp_path / "paused"),
    }
    root = tmp_path / "collections"
    with serve_process(env, tmp_path / "first.log") as (url, process):
        if stage == "collection-delete":
            assert httpx.post(url + "/collections", json={"name": "half"}, timeout=60).status_code == 201
            request = threading.Thread(
                target=lambda: _quietly(httpx.delete, url + "/collections/half", timeout=60)
            )
        else:
            request = threading.Thread(
                target=lambda: _quietly(httpx.post, url + "/collections", json={"name": "half"}, timeout=60)
            )
        request.start()
        deadline = time.monotonic() + 60
        while not (tmp_path / "paused").exists():
            assert time.monotonic() < deadline, "the process never reached the pause"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        request.join()
    staged = [p.name for p in root.iterdir() if p.name.startswith((".creating-", ".deleting-"))]
    assert staged and not (root / "half").exists()  # killed between the two renames: only a staging folder
    (tmp_path / "paused").unlink(missing_ok=True)
    with running_server({**env, "CLOZE_INDEX_PAUSE_AT": ""}, tmp_path / "second.log") as url:
        names = [entry["name"] for entry in httpx.get(url + "/collections", timeout=60).json()["collections"]]
        assert names == ["default"]
        assert not [p for p in root.iterdir() if p.name.startswith((".creating-", ".deleting-"))]
        assert httpx.post(url + "/collections", json={"name": "half"}, timeout=60).status_code == 201
        assert httpx.get(url + "/collections/half", timeout=60).json()["status"] == "ready"


def _quietly(call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except httpx.HTTPError:  # the server was killed under the request
        pass


def test_a_replica_follows_collections_as_the_writer_makes_and_deletes_them(
    admin, service, two_collections, data_root, tiny_bert, tmp_path
):
    replica_env = {
        "CLOZE_INDEX": str(data_root / "index"),
        "CLOZE_COLLECTIONS_DIR": str(data_root / "collections"),
        "CLOZE_MODELS": f"default=<bundled>,tiny={tiny_bert}",
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_BACKEND": "torch",
        "CLOZE_INDEX_READ_ONLY": "true",
    }
    with running_server(replica_env, tmp_path / "replica.log") as replica:

        def replica_ids(collection: str, query: str) -> list[str] | None:
            answer = httpx.post(
                f"{replica}/collections/{collection}/search",
                json={"query": query, "mode": "bm25"},
                timeout=30,
            )
            return [hit["id"] for hit in answer.json()["results"]] if answer.status_code == 200 else None

        def eventually(check, seconds: float = 15.0) -> None:
            deadline = time.monotonic() + seconds
            while not check():
                assert time.monotonic() < deadline, "the replica did not follow in time"
                time.sleep(0.2)

        assert replica_ids("papers", "inflation") == ["p2"]
        assert admin.post("/collections", json={"name": "later"}).status_code == 201
        assert (
            admin.put(
                "/collections/later/documents", json=[{"id": "l1", "text": "a late lighthouse"}]
            ).status_code
            == 200
        )
        eventually(lambda: replica_ids("later", "lighthouse") == ["l1"])  # a new collection, and its write
        # A collection of the caller's own vectors opens on the replica too (no model to load for it).
        assert admin.post("/collections", json={"name": "later-vectors", "dimension": 2}).status_code == 201
        vectors = [{"id": "v1", "vector": [1, 0]}, {"id": "v2", "vector": [0, 1]}]
        assert admin.put("/collections/later-vectors/documents", json=vectors).status_code == 200

        def replica_nearest() -> str | None:
            answer = httpx.post(
                f"{replica}/collections/later-vectors/search", json={"vector": [0.1, 1]}, timeout=30
            )
            return answer.json()["results"][0]["id"] if answer.status_code == 200 else None

        eventually(lambda: replica_nearest() == "v2")
        put = httpx.put(f"{replica}/collections/later/documents", json=[{"id": "x", "text": "y"}], timeout=30)
        assert put.status_code == 409  # a replica never writes
        assert admin.delete("/collections/later").status_code == 200
        eventually(lambda: httpx.get(f"{replica}/collections/later", timeout=30).status_code == 404)
        # Deleted and made again between two polls: the same name and version, another incarnation.
        assert admin.post("/collections", json={"name": "again"}).status_code == 201
        assert (
            admin.put("/collections/again/documents", json=[{"id": "old", "text": "a lamp"}]).status_code
            == 200
        )
        eventually(lambda: replica_ids("again", "lamp") == ["old"])
        assert admin.delete("/collections/again").status_code == 200
        assert admin.post("/collections", json={"name": "again"}).status_code == 201
        assert (
            admin.put("/collections/again/documents", json=[{"id": "new", "text": "a lamp"}]).status_code
            == 200
        )
        eventually(lambda: replica_ids("again", "lamp") == ["new"])
