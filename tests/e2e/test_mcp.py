"""`cloze mcp` as an agent meets it: the official MCP SDK's own client launches it as a subprocess over stdio,
against a real `cloze serve` on a socket. Every tool is listed and called, and each answer is checked against
the corpus or the same service's HTTP answer; a key scoped to one collection is refused another, an unknown key
is refused, and bad arguments come back as tool errors (isError) while the server goes on answering."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.conftest import READ_KEY, WRITE_KEY, free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
PAPERS_KEY = "mcp-papers-read-key-0123456789"
PAPERS = [
    {"id": "p1", "text": "Vaccines train the immune system to recognise a virus.", "metadata": {"year": 1998, "topic": "health"}},
    {"id": "p2", "text": "The central bank raised interest rates to slow inflation.", "metadata": {"year": 2008, "topic": "economy"}},
    {"id": "p3", "text": "A striker scored twice in the cup final on Sunday.", "metadata": {"year": 2014, "topic": "sport"}},
    {"id": "p4", "text": "Bond markets fell as the bank signalled more rate rises.", "metadata": {"year": 2022, "topic": "economy"}},
]  # fmt: skip
TOOLS = {"search", "get_document", "facets", "fill_mask", "list_collections"}


@pytest.fixture(scope="module")
def service(tiny_bert, tmp_path_factory) -> Any:
    """The bundled model (dense ranking means something), the tiny model for fill-mask, a collection `papers`
    and a key that may read only it."""
    root = tmp_path_factory.mktemp("mcp")
    env = {
        "CLOZE_INDEX": str(root / "index"),
        "CLOZE_COLLECTIONS_DIR": str(root / "collections"),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_READ_API_KEYS": READ_KEY,
        "CLOZE_COLLECTION_API_KEYS": f"{PAPERS_KEY}=read:papers",
    }
    with running_server(env, root / "server.log") as url:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {WRITE_KEY}"}, timeout=60) as http:
            assert http.post("/collections", json={"name": "papers"}).status_code == 201
            assert http.put("/collections/papers/documents", json=PAPERS).json()["upserted"] == len(PAPERS)
            yield url, http


@asynccontextmanager
async def mcp_session(
    url: str, key: str | None, log: Path, key_in_env: bool = False
) -> AsyncIterator[Client]:
    """`cloze mcp --url URL --api-key KEY` (or with CLOZE_API_KEY=KEY) launched by the SDK's stdio client, its
    stderr kept in ``log``."""
    args = ["-m", "app.cli", "mcp", "--url", url] + (["--api-key", key] if key and not key_in_env else [])
    env = {"HF_HUB_OFFLINE": "1"} | ({"CLOZE_API_KEY": key} if key and key_in_env else {})
    server = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT), env=env)
    with log.open("a") as errors:
        async with Client(stdio_client(server, errlog=errors)) as client:
            yield client


def run(
    url: str, key: str | None, log: Path, scenario: Callable[[Client], Any], key_in_env: bool = False
) -> Any:
    async def session() -> Any:
        async with mcp_session(url, key, log, key_in_env) as client:
            return await scenario(client)

    return asyncio.run(session())


def answer(result: Any) -> dict[str, Any]:
    """A successful call's JSON answer, read from the text the model sees (and equal to the structured one)."""
    assert not result.is_error, result.content[0].text
    shown = json.loads(result.content[0].text)
    assert shown == result.structured_content
    return shown


def ids(result: Any) -> list[str]:
    return [hit["id"] for hit in answer(result)["results"]]


def error_text(result: Any) -> str:
    assert result.is_error, result
    return result.content[0].text


def test_every_tool_is_listed_and_answers_as_the_service_does(service, tmp_path):
    url, http = service

    async def scenario(client: Client) -> dict[str, Any]:
        listed = (await client.list_tools()).tools
        calls = {
            "dense": await client.call_tool("search", {"query": "how do vaccines protect against viruses", "collection": "papers", "mode": "dense", "top_k": 2}),
            "bm25": await client.call_tool("search", {"query": "interest inflation", "collection": "papers", "mode": "bm25"}),
            "hybrid": await client.call_tool("search", {"query": "bank rates", "collection": "papers", "top_k": 2}),
            "filtered": await client.call_tool("search", {"query": "bank", "collection": "papers", "mode": "bm25", "filter": {"year": {"$gte": 2010}}, "include_text": True}),
            "facets": await client.call_tool("facets", {"fields": ["topic", "year"], "collection": "papers", "filter": {"topic": {"$ne": "sport"}}}),
            "document": await client.call_tool("get_document", {"id": "p2", "collection": "papers"}),
            "fill_mask": await client.call_tool("fill_mask", {"text": "the cat [MASK] on the mat .", "top_k": 3}),
            "collections": await client.call_tool("list_collections", {}),
            "default": await client.call_tool("search", {"query": "bank", "mode": "bm25"}),
        }  # fmt: skip
        return {"tools": listed, **calls}

    got = run(url, READ_KEY, tmp_path / "mcp.log", scenario)
    tools = {tool.name: tool for tool in got["tools"]}
    assert set(tools) == TOOLS
    assert all(tool.annotations.read_only_hint for tool in tools.values())
    search_schema = tools["search"].input_schema["properties"]
    assert {"query", "collection", "mode", "top_k", "filter", "vector"} <= set(search_schema)
    assert search_schema["mode"]["anyOf"][0]["enum"] == ["dense", "bm25", "hybrid"]

    assert ids(got["dense"])[0] == "p1" and answer(got["dense"])["mode"] == "dense"  # MiniLM's meaning
    assert ids(got["bm25"]) == ["p2"]  # the only document with either word
    assert set(ids(got["hybrid"])) == {"p2", "p4"} and answer(got["hybrid"])["mode"] == "hybrid"
    filtered = answer(got["filtered"])["results"]
    assert [hit["id"] for hit in filtered] == ["p4"] and filtered[0]["text"] == PAPERS[3]["text"]

    facets = answer(got["facets"])
    served = http.post(
        "/collections/papers/facets",
        json={"fields": ["topic", "year"], "filter": {"topic": {"$ne": "sport"}}},
    ).json()
    assert facets.pop("took_ms") >= 0 and served.pop("took_ms") >= 0  # the rest is the service's answer
    assert facets == served
    assert facets["total"] == 3 and facets["fields"]["year"]["numbers"] == {"min": 1998, "max": 2022}

    document = answer(got["document"])
    assert (document["id"], document["text"], document["metadata"]) == (
        "p2",
        PAPERS[1]["text"],
        PAPERS[1]["metadata"],
    )

    served = http.post(
        "/fill-mask", json={"inputs": "the cat [MASK] on the mat .", "parameters": {"top_k": 3}}
    )
    assert answer(got["fill_mask"]) == {"masks": [served.json()]}  # one mask: one list of three

    listed = [c["name"] for c in answer(got["collections"])["collections"]]
    assert (
        listed == [c["name"] for c in http.get("/collections").json()["collections"]] and "papers" in listed
    )
    assert (
        ids(got["default"]) == []
    )  # no collection named: the service's own index, which holds none of these


def test_a_key_scoped_to_one_collection_is_refused_another(service, tmp_path):
    url, _ = service

    async def scenario(client: Client) -> dict[str, Any]:
        return {
            "own": await client.call_tool(
                "search", {"query": "bank", "collection": "papers", "mode": "bm25"}
            ),
            "other": await client.call_tool("search", {"query": "bank", "mode": "bm25"}),
            "document": await client.call_tool("get_document", {"id": "p1"}),
            "collections": await client.call_tool("list_collections", {}),
        }

    got = run(
        url, PAPERS_KEY, tmp_path / "mcp.log", scenario, key_in_env=True
    )  # as docs/mcp.md configures it
    assert set(ids(got["own"])) == {"p2", "p4"}
    for refused in (got["other"], got["document"]):
        text = error_text(refused)
        assert "403" in text and "scoped" in text and "'default'" in text, text
    assert [c["name"] for c in answer(got["collections"])["collections"]] == ["papers"]


def test_an_unknown_key_is_a_tool_error_naming_the_key(service, tmp_path):
    url, _ = service

    async def scenario(client: Client) -> Any:
        return await client.call_tool("list_collections", {})

    text = error_text(run(url, "no-such-key-0123456789", tmp_path / "mcp.log", scenario))
    assert "401" in text and "--api-key" in text, text


def test_bad_arguments_are_tool_errors_and_the_server_goes_on(service, tmp_path):
    url, _ = service

    async def scenario(client: Client) -> dict[str, Any]:
        return {
            "mode": await client.call_tool("search", {"query": "bank", "mode": "fuzzy"}),
            "top_k": await client.call_tool("search", {"query": "bank", "top_k": "ten"}),
            "nothing": await client.call_tool("search", {"collection": "papers"}),
            "operator": await client.call_tool("search", {"query": "bank", "collection": "papers", "filter": {"year": {"$near": 3}}}),
            "missing": await client.call_tool("get_document", {"id": "p9", "collection": "papers"}),
            "no_mask": await client.call_tool("fill_mask", {"text": "no mask here"}),
            "after": await client.call_tool("search", {"query": "bank", "collection": "papers", "mode": "bm25"}),
        }  # fmt: skip

    got = run(url, READ_KEY, tmp_path / "mcp.log", scenario)
    assert "mode" in error_text(got["mode"]) and "top_k" in error_text(got["top_k"])  # the SDK's schema check
    assert "give a query" in error_text(got["nothing"])
    operator = error_text(got["operator"])
    assert "422" in operator and "filter.year" in operator, operator  # the service's refusal, its field named
    assert "404" in error_text(got["missing"]) and "p9" in error_text(got["missing"])
    assert "422" in error_text(got["no_mask"]) and "[MASK]" in error_text(got["no_mask"])
    assert set(ids(got["after"])) == {"p2", "p4"}  # the same server process still answers
    assert "unexpected" not in (tmp_path / "mcp.log").read_text()  # the SDK's word for a tool that crashed


@pytest.fixture(scope="module")
def mcp_over_http(service, tmp_path_factory) -> Any:
    """`cloze mcp --http PORT`: one process for every caller, each call sent with its caller's key."""
    url, _ = service
    port, log = free_port(), tmp_path_factory.mktemp("mcp-http") / "mcp.log"
    command = [sys.executable, "-m", "app.cli", "mcp", "--url", url, "--http", str(port)]
    with log.open("w") as errors:
        process = subprocess.Popen(command, cwd=ROOT, stdout=errors, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not listening(port):
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            process.wait(timeout=30)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def call_over_http(endpoint: str, key: str | None, name: str, arguments: dict[str, Any]) -> Any:
    async def session() -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with Client(streamable_http_client(endpoint, http_client=http)) as client:
                return await client.call_tool(name, arguments)

    return asyncio.run(session())


def test_over_http_each_call_carries_its_callers_key(mcp_over_http):
    """Two callers of one `cloze mcp --http`: each sees what its own key may read, and a caller with no key is
    refused by the service, never served with a key of the MCP server's."""
    everything = answer(call_over_http(mcp_over_http, READ_KEY, "list_collections", {}))["collections"]
    assert {"default", "papers"} <= {c["name"] for c in everything}
    scoped = answer(call_over_http(mcp_over_http, PAPERS_KEY, "list_collections", {}))["collections"]
    assert [c["name"] for c in scoped] == ["papers"]
    found = call_over_http(
        mcp_over_http, PAPERS_KEY, "search", {"query": "bank", "collection": "papers", "mode": "bm25"}
    )
    assert set(ids(found)) == {"p2", "p4"}
    refused = error_text(call_over_http(mcp_over_http, PAPERS_KEY, "get_document", {"id": "p1"}))
    assert "403" in refused and "'default'" in refused, refused
    keyless = error_text(call_over_http(mcp_over_http, None, "list_collections", {}))
    assert "401" in keyless and "to the MCP endpoint" in keyless, keyless  # the HTTP caller's remedy


def test_http_refuses_a_key_of_its_own():
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "mcp", "--http", "9", "--api-key", "lent-to-anyone"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "caller's own key" in done.stderr
