"""``cloze_search.Client`` and ``AsyncClient`` against the session's real server: collections, documents (batched
upserts, paging, get, delete), search with its options, snapshots (download with a progress bar, restore,
upload), embed, fill-mask, errors carrying the service's message and field, keys and timeouts;
and the CLI's --url commands on the client (the retry on 429 is tests/cloze_search/test_client_units.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import cloze_search
from cloze_search import AsyncClient, Client, Document, Fusion, InvalidRequest, NotFound, Unauthorized
from tests.e2e.conftest import READ_KEY, WRITE_KEY

ROOT = Path(__file__).resolve().parents[2]

ANIMALS = [
    Document("cat", "Cats purr and chase mice around the barn.", {"kind": "mammal", "legs": 4}),
    Document("eagle", "Eagles soar high above the mountains hunting prey.", {"kind": "bird", "legs": 2}),
    Document("shark", "Sharks swim in the deep ocean and hunt fish.", {"kind": "fish", "legs": 0}),
    Document("dog", "Dogs bark at strangers and fetch sticks in the park.", {"kind": "mammal", "legs": 4}),
    Document("owl", "Owls hunt mice at night with silent wings.", {"kind": "bird", "legs": 2}),
]


@pytest.fixture(scope="module")
def sdk(server) -> Client:
    with Client(server, api_key=WRITE_KEY) as client:
        client.create_collection("animals")
        assert client.upsert(ANIMALS, collection="animals", batch_size=2) == 5  # three requests
        yield client


def test_search_with_its_options(sdk):
    hits = sdk.search("birds of prey hunting", collection="animals", top_k=2, mode="dense")
    assert hits.mode == "dense" and hits.results[0].id in {"eagle", "owl"}
    assert {hit.id for hit in sdk.search("mice", collection="animals", mode="bm25")} == {"cat", "owl"}
    mammals = sdk.search("animals", collection="animals", filter={"kind": "mammal"}, top_k=5)
    assert {hit.id for hit in mammals} == {"cat", "dog"}
    page = sdk.search("hunting animals", collection="animals", top_k=2, offset=2)
    whole = sdk.search("hunting animals", collection="animals", top_k=4)
    assert [h.id for h in page] == [h.id for h in whole.results[2:4]]
    rich = sdk.search(
        "hunt mice", collection="animals", top_k=1, include_text=True, highlight=True, explain=True,
        fusion=Fusion("convex", alpha=0.3),
    )  # fmt: skip
    hit = rich.results[0]
    assert hit.text and hit.highlights and hit.explain is not None and hit.explain.bm25_rank is not None


def test_documents_get_list_and_delete(sdk):
    assert sdk.get_document("cat", collection="animals").metadata == {"kind": "mammal", "legs": 4}
    assert [d.id for d in sdk.list_documents(collection="animals", page_size=2)] == sorted(
        d.id for d in ANIMALS
    )
    birds = sdk.list_documents(collection="animals", filter={"kind": "bird"}, page_size=1)
    assert [d.id for d in birds] == ["eagle", "owl"]
    assert sdk.count_documents(collection="animals", filter={"legs": {"$gte": 2}}) == 4
    sdk.upsert([{"id": "tmp", "text": "a passing note"}], collection="animals")
    assert sdk.delete_document("tmp", collection="animals") == "tmp"
    with pytest.raises(NotFound) as missing:
        sdk.get_document("tmp", collection="animals")
    assert missing.value.status == 404 and missing.value.field == "doc_id"


def test_errors_carry_the_service_message_and_field(sdk, server):
    with pytest.raises(InvalidRequest) as bad:
        sdk.search("x", collection="animals", filter={"kind": {"$gt": "bird"}})
    assert bad.value.status == 422 and bad.value.field.startswith("filter") and "kind" in bad.value.message
    with pytest.raises(InvalidRequest) as empty:
        sdk.upsert([{"id": "e", "text": "  "}], collection="animals")
    assert empty.value.field == "0.text"
    with Client(server) as anonymous, pytest.raises(Unauthorized):
        anonymous.upsert([{"id": "x", "text": "no key"}], collection="animals")
    with Client(server, api_key=READ_KEY) as reader:
        assert len(reader.search("cats", collection="animals")) > 0  # a read key reads
    # A listener that never answers: the read timeout must fire (a 1 us timeout against the real server raced
    # its answer on a loaded machine).
    with (
        socket.create_server(("127.0.0.1", 0)) as silent,
        Client(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.2) as hurried,
        pytest.raises(cloze_search.ConnectionFailed, match="Timeout"),
    ):
        hurried.search("timeouts apply", collection="animals")


def test_snapshot_download_restore_and_upload(sdk, tmp_path, capsys):
    snapshot = sdk.create_snapshot(collection="animals")
    assert snapshot.documents == 5 and snapshot.name in {
        s.name for s in sdk.list_snapshots(collection="animals")
    }
    archive = sdk.download_snapshot(snapshot.name, tmp_path, collection="animals")
    assert archive.stat().st_size == snapshot.bytes and tarfile.is_tarfile(archive)
    assert "B/s" in capsys.readouterr().err  # the progress bar
    sdk.delete_document("dog", collection="animals")
    assert sdk.restore_snapshot(snapshot.name, collection="animals").documents == 5
    assert sdk.get_document("dog", collection="animals").id == "dog"
    sdk.delete_document("dog", collection="animals")
    assert sdk.upload_snapshot(archive, collection="animals").documents == 5
    assert sdk.count_documents(collection="animals") == 5


def test_inference_routes(sdk):
    vectors = sdk.embed(["a cat", "a dog"])
    assert len(vectors) == 2 and len(vectors[0]) == 384
    predictions = sdk.fill_mask("Paris is the capital of [MASK].", top_k=3)
    assert len(predictions) == 1 and len(predictions[0]) == 1 and len(predictions[0][0]) == 3
    with pytest.raises(InvalidRequest) as no_mask:
        sdk.fill_mask("no mask here")
    assert no_mask.value.field == "inputs[0]"


def test_the_async_client_does_the_same(server):
    async def run() -> tuple:
        async with AsyncClient(server, api_key=WRITE_KEY) as client:
            await client.upsert(ANIMALS[:2], collection="animals")
            hits = await client.search("soaring birds", collection="animals", mode="dense", top_k=1)
            listed = [d.id async for d in client.list_documents(collection="animals", page_size=2)]
            with pytest.raises(NotFound):
                await client.get_collection("no-such-collection")
            return hits.results[0].id, listed, (await client.get_collection("animals")).documents

    top, listed, count = asyncio.run(run())
    assert top == "eagle" and listed == sorted(d.id for d in ANIMALS) and count == 5


def test_the_async_client_downloads_and_uploads_snapshots(sdk, server, tmp_path):
    """The async twin of the snapshot test above; its upload streams the archive through worker-thread reads
    (httpx.AsyncClient takes no blocking file), with the length declared as the blocking client does."""

    async def run() -> tuple:
        async with AsyncClient(server, api_key=WRITE_KEY) as client:
            snapshot = await client.create_snapshot(collection="animals")
            archive = await client.download_snapshot(snapshot.name, tmp_path, collection="animals")
            await client.delete_document("dog", collection="animals")
            restored = await client.upload_snapshot(archive, collection="animals")
            return snapshot, archive, restored, await client.get_document("dog", collection="animals")

    snapshot, archive, restored, dog = asyncio.run(run())
    assert archive.stat().st_size == snapshot.bytes and tarfile.is_tarfile(archive)
    assert restored.documents == 5 and dog.id == "dog"
    assert sdk.count_documents(collection="animals") == 5


def cloze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_cli_url_commands_go_through_the_client(server, tmp_path):
    """The six ``--url`` commands: collection create, list, show, delete; index snapshot (+ download), restore."""
    key = ["--url", server, "--api-key", WRITE_KEY]
    made = cloze("collection", "create", "cli-vectors", "--dimension", "3", "--metric", "dot", *key)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout) | {"name": "cli-vectors", "model": None, "metric": "dot"} == json.loads(
        made.stdout
    )
    listed = json.loads(cloze("collection", "list", *key).stdout)["collections"]
    assert "cli-vectors" in [c["name"] for c in listed]
    with Client(server, api_key=WRITE_KEY) as client:
        client.upsert([Document("v", vector=[1, 2, 3])], collection="cli-vectors")
    assert json.loads(cloze("collection", "show", "cli-vectors", *key).stdout)["documents"] == 1
    archive = tmp_path / "cli.tar"
    snapshot = cloze("index", "snapshot", "--collection", "cli-vectors", "--download", str(archive), *key)
    assert snapshot.returncode == 0 and tarfile.is_tarfile(archive), snapshot.stderr
    restored = cloze("index", "restore", str(archive), "--collection", "cli-vectors", *key)
    assert restored.returncode == 0 and json.loads(restored.stdout)["documents"] == 1, restored.stderr
    assert json.loads(cloze("collection", "delete", "cli-vectors", *key).stdout) == {"deleted": "cli-vectors"}
    refused = cloze("collection", "show", "cli-vectors", *key)
    assert (
        refused.returncode != 0
        and "404" in refused.stderr
        and "no collection named 'cli-vectors'" in refused.stderr
    )
    bad_key = cloze("collection", "create", "x", "--url", server, "--api-key", READ_KEY)
    assert bad_key.returncode != 0 and ("403" in bad_key.stderr or "401" in bad_key.stderr), bad_key.stderr
