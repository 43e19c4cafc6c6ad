"""The client's mechanics on a scripted transport (a real server is not made to refuse on cue): the retry on 429
that honours Retry-After, errors as exceptions with the service's message and field, and the requests it sends."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import httpx
import pytest

import cloze_search
from cloze_search import Client, Document, Fusion, Rerank
from cloze_search._http import ByteProgress, readable_bytes


def scripted(answers: list[tuple[int, dict]], sent: list[httpx.Request] | None = None) -> dict:
    """``http_options`` for a client whose requests get ``answers`` in turn (status, body)."""
    replies = iter(answers)

    def reply(request: httpx.Request) -> httpx.Response:
        if sent is not None:
            sent.append(request)
        status, body = next(replies)
        body = dict(body)  # the same answer may be scripted several times
        headers = {"Retry-After": str(body.pop("retry_after"))} if "retry_after" in body else {}
        return httpx.Response(status, json=body, headers=headers)

    return {"transport": httpx.MockTransport(reply)}


def test_upsert_retries_429_after_retry_after(monkeypatch):
    """Two refusals then a success: the client waits what Retry-After says each time and sends again."""
    waits: list[float] = []
    monkeypatch.setattr("cloze_search.client.time.sleep", waits.append)
    full = {"error": "queue full", "field": None}
    answers = [(429, full | {"retry_after": 3}), (503, full | {"retry_after": 1}), (200, {"upserted": 1})]
    with Client("http://service", http_options=scripted(answers)) as client:
        assert client.upsert([Document("a", "text")]) == 1
    assert waits == [3.0, 1.0]
    with Client(
        "http://service", max_retries=2, http_options=scripted([(429, full | {"retry_after": 2})] * 3)
    ) as c:
        with pytest.raises(cloze_search.Overloaded) as overloaded:
            c.upsert([Document("a", "text")])
    assert overloaded.value.retry_after == 2.0 and overloaded.value.message == "queue full"
    assert waits == [3.0, 1.0, 2.0, 2.0]  # two retries, then the error


def test_errors_carry_status_message_and_field():
    cases = [
        (422, cloze_search.InvalidRequest),
        (404, cloze_search.NotFound),
        (409, cloze_search.Conflict),
        (403, cloze_search.Unauthorized),
        (507, cloze_search.ClozeError),
    ]
    for status, kind in cases:
        refusal = {"error": "what went wrong", "field": "3.vector"}
        with Client("http://service", http_options=scripted([(status, refusal)])) as client:
            with pytest.raises(kind) as raised:
                client.get_collection("x")
        assert (raised.value.status, raised.value.field, raised.value.message) == (
            status, "3.vector", "what went wrong",
        )  # fmt: skip


def test_requests_carry_every_option_and_batches_split():
    sent: list[httpx.Request] = []
    answers = [(200, {"results": [], "took_ms": 1.0, "mode": "hybrid"})] + [(200, {"upserted": 2})] * 3
    with Client("http://service", api_key="k", http_options=scripted(answers, sent)) as client:
        client.search(
            "q", collection="my docs", vector=[1, 2], top_k=3, offset=6, mode="hybrid", filter={"y": 1},
            include_text=True, highlight=True, fusion=Fusion("convex", alpha=0.2), explain=True, rerank=Rerank(20),
        )  # fmt: skip
        assert client.upsert(({"id": str(i), "text": "t"} for i in range(5)), batch_size=2) == 6
    search = sent[0]
    assert (
        search.url.raw_path == b"/collections/my%20docs/search"
        and search.headers["authorization"] == "Bearer k"
    )
    assert json.loads(search.content) == {
        "query": "q", "vector": [1.0, 2.0], "top_k": 3, "offset": 6, "mode": "hybrid", "filter": {"y": 1},
        "include_text": True, "highlight": True, "fusion": {"method": "convex", "alpha": 0.2}, "explain": True,
        "rerank": {"candidates": 20, "text": "document"},
    }  # fmt: skip
    assert [len(json.loads(r.content)) for r in sent[1:]] == [2, 2, 1]  # documents a request


def test_facets_sends_fields_filter_and_top_in_both_clients():
    answer = {"total": 2, "fields": {"year": {"type": "number", "documents": 2}}, "took_ms": 0.1}
    sent: list[httpx.Request] = []
    with Client("http://service", http_options=scripted([(200, answer)] * 2, sent)) as client:
        assert client.facets(["year"], collection="notes", filter={"kind": "memo"}, top=3) == answer
        client.facets(["year", "kind"])

    async def facets_async() -> dict:
        async with cloze_search.AsyncClient(
            "http://service", http_options=scripted([(200, answer)], sent)
        ) as c:
            return await c.facets(["kind"], top=5)

    assert asyncio.run(facets_async()) == answer
    assert [request.url.path for request in sent] == [
        "/collections/notes/facets", "/collections/default/facets", "/collections/default/facets",
    ]  # fmt: skip
    assert [json.loads(request.content) for request in sent] == [
        {"fields": ["year"], "top": 3, "filter": {"kind": "memo"}},
        {"fields": ["year", "kind"], "top": 10},
        {"fields": ["kind"], "top": 5},
    ]


def test_upload_snapshot_streams_the_file_with_its_length_in_both_clients(tmp_path):
    """A block iterator, not the file read whole, with Content-Length declared (not chunked), so the service
    checks its free space before reading; the async twin reads in worker threads (httpx.AsyncClient takes no
    blocking file)."""
    archive = tmp_path / "archive.tar"
    archive.write_bytes(b"x" * 3_000_000)  # three blocks
    received: list[tuple[str | None, str | None, int]] = []

    def seen(request: httpx.Request, body: bytes) -> None:
        headers = request.headers
        received.append((headers.get("content-length"), headers.get("transfer-encoding"), len(body)))

    def reply(request: httpx.Request) -> httpx.Response:
        seen(request, request.read())
        return httpx.Response(200, json={"version": 2, "documents": 5})

    async def areply(request: httpx.Request) -> httpx.Response:
        seen(request, await request.aread())
        return httpx.Response(200, json={"version": 3})

    with Client("http://service", http_options={"transport": httpx.MockTransport(reply)}) as client:
        assert client.upload_snapshot(archive, collection="c").documents == 5

    async def upload() -> int:
        transport = httpx.MockTransport(areply)
        async with cloze_search.AsyncClient("http://service", http_options={"transport": transport}) as c:
            return (await c.upload_snapshot(archive, collection="c")).version

    assert asyncio.run(upload()) == 3
    assert received == [("3000000", None, 3_000_000)] * 2


BUSY = {"error": "the bucket did not confirm in time", "field": None}
Received = list[tuple[int, str | None]]  # each request's body length and its Content-Length header


def answering(answers: list[tuple[int, dict]], received: Received) -> tuple[dict, dict]:
    """``http_options`` for a Client and an AsyncClient whose requests get ``answers`` in turn (Retry-After 0),
    each request's body read whole and noted in ``received``."""
    replies = iter(answers)

    def answer(request: httpx.Request, body: bytes) -> httpx.Response:
        received.append((len(body), request.headers.get("content-length")))
        status, content = next(replies)
        return httpx.Response(status, json=content, headers={"Retry-After": "0"})

    def reply(request: httpx.Request) -> httpx.Response:
        return answer(request, request.read())

    async def areply(request: httpx.Request) -> httpx.Response:
        return answer(request, await request.aread())

    return {"transport": httpx.MockTransport(reply)}, {"transport": httpx.MockTransport(areply)}


def test_a_retried_upload_sends_the_whole_file_again_and_a_pipe_is_not_retried(tmp_path):
    """An upload answered 503 was retried with the file already read to its end: the retry declared 200,000
    bytes and sent none. A file is read again from where it started; a pipe, which cannot be, is not retried
    (the 503 is raised) and, its length unknown, is sent chunked."""
    restored = {"version": 2, "documents": 5}

    def upload(path: Path, asynchronously: bool, answers: list, received: Received) -> int | None:
        sync, asynchronous = answering(answers, received)

        async def upload_async() -> int | None:
            async with cloze_search.AsyncClient("http://service", http_options=asynchronous) as client:
                return (await client.upload_snapshot(path)).documents

        if asynchronously:
            return asyncio.run(upload_async())
        with Client("http://service", http_options=sync) as client:
            return client.upload_snapshot(path).documents

    archive, pipe = tmp_path / "archive.tar", tmp_path / "pipe"
    archive.write_bytes(b"x" * 200_000)
    os.mkfifo(pipe)
    for asynchronously in (False, True):
        received: Received = []
        assert upload(archive, asynchronously, [(503, BUSY), (200, restored)], received) == 5
        assert received == [(200_000, "200000")] * 2
        received.clear()
        writer = threading.Thread(target=pipe.write_bytes, args=(b"y" * 200_000,))
        writer.start()
        with pytest.raises(cloze_search.Overloaded):
            upload(pipe, asynchronously, [(503, BUSY), (200, restored)], received)
        writer.join()
        assert received == [(200_000, None)]  # once, whole, chunked


def test_a_delete_retried_after_it_committed_counts_as_done():
    """With ``ack=remote`` a delete commits, then answers 503 when the bucket does not confirm in time; its
    retry found nothing and raised NotFound for a delete that had happened. A delete retried after a 429 or
    503 that then finds nothing is done; a 404 at the first attempt still raises."""
    missing = (404, {"error": "no document with id 'd'", "field": "doc_id"})

    def delete(answers: list, asynchronously: bool) -> str:
        sync, asynchronous = answering(answers, [])

        async def delete_async() -> str:
            async with cloze_search.AsyncClient("http://service", http_options=asynchronous) as client:
                return await client.delete_document("d")

        if asynchronously:
            return asyncio.run(delete_async())
        with Client("http://service", http_options=sync) as client:
            return client.delete_document("d")

    for asynchronously in (False, True):
        assert delete([(503, BUSY), missing], asynchronously) == "d"
        assert delete([(429, BUSY), (200, {"deleted": "d"})], asynchronously) == "d"
        with pytest.raises(cloze_search.NotFound):
            delete([missing], asynchronously)


def test_a_download_progress_line_counts_bytes_and_rate(capsys):
    """The client's own progress line (no tqdm: httpx is its one requirement): rewritten in place on stderr,
    ended with the whole count, silent when progress is off."""
    assert [readable_bytes(n) for n in (0, 999, 1000, 1_234_567, 5e12)] == [
        "0 B", "999 B", "1.0 kB", "1.2 MB", "5000.0 GB",
    ]  # fmt: skip
    bar = ByteProgress("base.tar", 3000, enabled=True, every=0)
    bar.update(1000)
    bar.update(2000)
    bar.close()
    shown = capsys.readouterr().err
    assert shown.endswith("\n") and shown.count("\r") == 3
    assert shown.rstrip().split("\r")[-1].startswith(
        "base.tar: 3.0 kB of 3.0 kB, "
    ) and shown.rstrip().endswith("B/s")
    quiet = ByteProgress("base.tar", None, enabled=False, every=0)
    quiet.update(10)
    quiet.close()
    assert capsys.readouterr().err == ""
