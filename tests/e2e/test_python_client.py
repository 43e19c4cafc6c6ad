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
    key = ["--url", server, "--api-key", WRITE_KEY, "--json"]
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
    snapshot = cloze(
        "index", "snapshot", "--collection", "cli-vectors", "--download", str(archive), *key[:-1]
    )
    assert snapshot.returncode == 0 and tarfile.is_tarfile(archive), snapshot.stderr
    restored = cloze("index", "restore", str(archive), "--collection", "cli-vectors", *key[:-1])
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


def quiet_cli(*args: str) -> subprocess.CompletedProcess:
    """A ``cloze`` command that succeeded and logged nothing of its HTTP requests (httpx logs each at INFO)."""
    done = cloze(*args)
    assert done.returncode == 0, done.stderr
    assert "httpx" not in done.stderr and "HTTP Request" not in done.stderr, done.stderr
    return done


def test_the_cli_puts_gets_and_searches_for_people_and_for_scripts(server, tmp_path):
    """``cloze documents put|get`` and ``cloze search`` on --url: lines to read by default, JSON with --json."""
    key = ["--url", server, "--api-key", WRITE_KEY, "--collection", "cli-docs"]
    quiet_cli("collection", "create", "cli-docs", "--url", server, "--api-key", WRITE_KEY)
    stored = quiet_cli("documents", "put", "kestrel", "Kestrels hover over fields hunting voles.",
                       "--metadata", '{"kind": "bird"}', *key)  # fmt: skip
    assert stored.stdout.strip() == "stored 1 document in 'cli-docs'"
    lines = tmp_path / "more.jsonl"
    lines.write_text(json.dumps({"id": "trout", "text": "Trout swim up cold rivers.", "metadata": {"kind": "fish"}})
                     + "\n\n" + json.dumps({"id": "heron", "text": "Herons wade and spear fish."}) + "\n")  # fmt: skip
    assert json.loads(quiet_cli("documents", "put", "--input", str(lines), *key, "--json").stdout) == {
        "upserted": 2,
        "collection": "cli-docs",
    }
    shown = quiet_cli("documents", "get", "kestrel", *key).stdout
    assert shown.splitlines()[0].split() == ["id:", "kestrel"] and '"kind": "bird"' in shown
    assert shown.rstrip().endswith("Kestrels hover over fields hunting voles.") and not shown.startswith("{")
    assert json.loads(quiet_cli("documents", "get", "trout", *key, "--json").stdout) == {
        "id": "trout",
        "text": "Trout swim up cold rivers.",
        "metadata": {"kind": "fish"},
        "vector": None,
    }
    found = quiet_cli("search", "birds hunting voles", "-k", "2", *key).stdout.splitlines()
    assert found[0].startswith("2 hits (hybrid, ") and found[1].split()[:3] == [
        "1",
        found[1].split()[1],
        "kestrel",
    ]
    assert "Kestrels hover over fields hunting voles." in found[1] and found[2].split() == ["kind=bird"]
    answer = json.loads(quiet_cli("search", "cold rivers", "--mode", "bm25", "--filter", '{"kind": "fish"}', *key,
                                  "--json").stdout)  # fmt: skip
    assert answer["mode"] == "bm25" and [hit["id"] for hit in answer["results"]] == ["trout"]
    missing = cloze("documents", "get", "nobody", *key)
    assert missing.returncode != 0 and "404" in missing.stderr and "nobody" in missing.stderr, missing.stderr


def test_collection_list_and_show_agree_offline_and_over_url(server, server_env):
    """The same fields from the same collection, read by the service (--url) or from its folder (--root):
    build options as the published version was built, live counts in both, bytes on disk in show."""
    root = str(Path(server_env["CLOZE_INDEX"]).parent / "collections")
    url = ["--url", server, "--api-key", WRITE_KEY]
    quiet_cli("collection", "create", "cli-agree", "--chunk-overlap", "3", "--factory", "HNSW16", *url)
    with Client(server, api_key=WRITE_KEY) as client:
        client.upsert(ANIMALS, collection="cli-agree")
        client.delete_document("dog", collection="cli-agree")
    served = {
        c["name"]: c
        for c in json.loads(quiet_cli("collection", "list", *url, "--json").stdout)["collections"]
    }
    stored = {c["name"]: c for c in json.loads(quiet_cli("collection", "list", "--root", root, "--json").stdout)["collections"]}  # fmt: skip
    assert stored["cli-agree"] == served["cli-agree"]
    listed = stored["cli-agree"]
    assert (listed["documents"], listed["factory"], listed["chunk_overlap"]) == (4, "HNSW16", 3)
    assert listed["chunk_window"] and listed["bytes_on_disk"] is None, listed
    shown_served = json.loads(quiet_cli("collection", "show", "cli-agree", *url, "--json").stdout)
    shown_stored = json.loads(quiet_cli("collection", "show", "cli-agree", "--root", root, "--json").stdout)
    assert shown_stored == shown_served and shown_served["bytes_on_disk"] > 0
    assert shown_served | {"bytes_on_disk": None, "last_write": None} == listed
    for where in (url, ["--root", root]):  # for people: a table, and one field a line
        table = quiet_cli("collection", "list", *where).stdout.splitlines()
        assert table[0].split() == [
            "NAME",
            "MODEL",
            "STATUS",
            "DOCUMENTS",
            "CHUNKS",
            "FACTORY",
            "CHUNK_WINDOW",
        ]
        row = next(line.split() for line in table if line.startswith("cli-agree "))
        assert row == ["cli-agree", "default", "ready", "4", str(listed["chunks"]), listed["factory"],
                       str(listed["chunk_window"])]  # fmt: skip
        card = quiet_cli("collection", "show", "cli-agree", *where).stdout
        assert f"bytes_on_disk: {shown_served['bytes_on_disk']}" in " ".join(card.split())


def test_a_url_that_is_not_the_service_root_says_what_is_wrong(server):
    """A base URL with a path (as the openai client takes, ``.../v1``; or the page ``.../docs``) got a bare 404,
    and one without a scheme a ConnectionFailed about protocols: each now says what to write instead."""
    for wrong in (server + "/v1", server + "/docs/"):
        shown = wrong.rstrip("/")
        with Client(wrong, api_key=WRITE_KEY) as client, pytest.raises(NotFound) as refused:
            client.list_collections()
        message = str(refused.value)
        assert f"{shown}/collections found no route" in message, message
        assert f"URL {shown} has a path" in message and "probably not the service's root" in message, message
        assert message.endswith(f"as {server}"), message

        async def search(url: str = wrong) -> None:
            async with AsyncClient(url, api_key=WRITE_KEY) as client:
                await client.search("moon")

        with pytest.raises(NotFound, match="probably not the service's root"):
            asyncio.run(search())
        cli = cloze("search", "moon", "--url", wrong, "--api-key", WRITE_KEY)
        assert cli.returncode != 0 and f"{shown} has a path" in cli.stderr, cli.stderr
    with Client(server, api_key=WRITE_KEY) as client, pytest.raises(NotFound) as missing:
        client.get_collection("no-such-collection")  # the service's own 404s stay as they are
    assert "no collection named 'no-such-collection'" in (kept := str(missing.value)) and "route" not in kept
    bare = server.removeprefix("http://")
    for make in (Client, AsyncClient):
        with pytest.raises(ValueError, match=f"has no scheme: add http:// \\(http://{bare}\\)"):
            make(bare)
    with pytest.raises(ValueError, match="the client speaks http:// or https://"):
        Client("ftp://" + bare)
    cli = cloze("documents", "get", "x", "--url", bare)
    assert cli.returncode != 0 and f"add http:// (http://{bare})" in cli.stderr, cli.stderr
