"""Hostile and oversized input against `cloze serve` on the demo index with the shipped models (issue 19).

Each case asserts the status, that the server process's peak RSS stayed under ``RSS_LIMIT_MB`` while it
ran (``/proc/PID/clear_refs`` resets the peak, ``VmHWM`` reads it), and that an ordinary search still
works afterwards. The server runs keyless on loopback, the mode a new user starts in, so the browser
guards (Host, Origin, form posts) are exercised too. ``HOSTILE_RESULTS=path.json`` writes the measured
peaks (RELIABILITY.md quotes them from benchmarks/results/hostile_input.json).
"""

from __future__ import annotations

import gzip
import http.client
import itertools
import json
import os
import random
import shutil
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness.archives import hostile_archives, neutralised_archives
from tests.e2e.conftest import serve_process

ROOT = Path(__file__).resolve().parents[2]
DEMO_INDEX = ROOT / "data" / "demo-index"
# The shipped models take ~530 MB; ONNX Runtime's arena keeps what its largest embedding pass needed (with
# a CPU pass's 512 tokens the process then plateaus near 0.8 GB, and peaks at 0.85 GB: the 550 KB upsert,
# the 1,024-mask fill-mask and the 300,000-value filter in benchmarks/results/hostile_input.json; at 8,192
# tokens a pass it plateaued at 1.5-1.76 GB). The bound is the peak plus half again; an input whose memory
# grew with its size (the 2.3 GB search, the 16 GB fill-mask of issue 19) breaks it.
RSS_LIMIT_MB = 1300
HEADER_TIMEOUT_S = 2
SLICE = 300  # speeches in the index built when data/demo-index is absent
MEASURED: dict[str, dict] = {}


class Server:
    log: Path

    def __init__(self, url: str, process: subprocess.Popen):
        self.url, self.process = url, process
        self.http = httpx.Client(base_url=url, timeout=120)

    def status(self) -> dict[str, float]:
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024
        return fields

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    """A private copy of the demo index (`make demo-index` builds data/demo-index). Without one (a fresh
    clone), an index of the corpus's first ``SLICE`` speeches: the whole one takes minutes to embed, and
    these cases test bounds, not ranking."""
    target = tmp_path_factory.mktemp("demo") / "index"
    if DEMO_INDEX.is_dir():
        shutil.copytree(DEMO_INDEX, target)
        return target
    corpus = target.parent / "slice.jsonl.gz"
    with gzip.open(ROOT / "app/demo/corpus.jsonl.gz", "rt") as source, gzip.open(corpus, "wt") as sliced:
        sliced.writelines(itertools.islice(source, SLICE))
    command = [
        sys.executable,
        "-m",
        "app.cli",
        "index",
        "build",
        "--input",
        str(corpus),
        "--out",
        str(target),
    ]
    subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return target


@pytest.fixture(scope="module")
def server(demo_index, tmp_path_factory) -> Iterator[Server]:
    log_path = tmp_path_factory.mktemp("hostile-logs") / "server.log"
    env = {
        "CLOZE_INDEX": str(demo_index),
        "CLOZE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "CLOZE_MAX_PENDING": "8",
        "CLOZE_MAX_PAGE_BYTES": "700000",
    }
    keyless = ("CLOZE_API_KEYS", "CLOZE_READ_API_KEYS", "CLOZE_FILL_MASK_MODEL", "CLOZE_MODEL")
    with serve_process(env, log_path, timeout=300, drop=keyless) as (url, process):
        served = Server(url, process)
        served.log = log_path
        for _ in range(600):  # the shipped fill-mask model loads just after the index opens
            if served.http.get("/readyz").json().get("fill_mask"):
                break
            time.sleep(0.2)
        yield served
    if os.environ.get("HOSTILE_RESULTS"):
        Path(os.environ["HOSTILE_RESULTS"]).write_text(
            json.dumps({"rss_limit_mb": RSS_LIMIT_MB, "cases": MEASURED}, indent=2)
        )


def check(server: Server, name: str, send, expected: int | set[int], limit_mb: float = RSS_LIMIT_MB):
    """Run ``send`` with the peak reset; assert its status, the peak RSS, and that search still works."""
    before = server.status()["VmRSS"]
    server.reset_peak()
    started = time.perf_counter()
    reply = send(server.http)
    took = time.perf_counter() - started
    after = server.status()
    statuses = expected if isinstance(expected, set) else {expected}
    got = reply.status_code if isinstance(reply, httpx.Response) else reply
    MEASURED[name] = {
        "status": got,
        "rss_before_mb": round(before, 1),
        "peak_rss_mb": round(after["VmHWM"], 1),
        "seconds": round(took, 2),
    }
    assert got in statuses, (name, got, getattr(reply, "text", "")[:300])
    assert after["VmHWM"] < limit_mb, (name, after)
    ordinary = server.http.post("/search", json={"query": "how do vaccines work", "mode": "hybrid"})
    assert ordinary.status_code == 200 and ordinary.json()["results"], name
    return reply


def field_of(reply: httpx.Response) -> str | None:
    return reply.json().get("field")


# ---- cost-based bounds -------------------------------------------------------------------------------


def test_fill_mask_of_510_masks_per_text_is_refused_by_mask_count(server):
    body = {"inputs": [" ".join(["[MASK]"] * 510)] * 4}
    reply = check(server, "fill-mask 4 x 510 masks", lambda h: h.post("/fill-mask", json=body), 422)
    assert field_of(reply) == "inputs[0]" and "64" in reply.json()["error"]


def test_fill_mask_at_its_limits_answers_within_the_memory_bound(server):
    text = "the " + " and ".join(["[MASK]"] * 64) + " ."
    body = {
        "inputs": [text] * 16,
        "parameters": {"top_k": 50},
    }  # 1,024 masks: the admission limit, all at once
    reply = check(server, "fill-mask 16 x 64 masks, top_k 50", lambda h: h.post("/fill-mask", json=body), 200)
    answer = reply.json()
    assert len(answer) == 16 and all(len(text_masks) == 64 for text_masks in answer)
    over = {"inputs": [text] * 17}
    refused = check(server, "fill-mask 17 x 64 masks", lambda h: h.post("/fill-mask", json=over), 422)
    assert "1024" in refused.json()["error"]


def test_fill_mask_overload_is_429_with_retry_after(server):
    text = " ".join(["[MASK]"] * 64)
    body = {"inputs": [text] * 16}

    def burst(http: httpx.Client) -> int:
        with ThreadPoolExecutor(6) as pool:
            replies = list(
                pool.map(lambda _: httpx.post(server.url + "/fill-mask", json=body, timeout=120), range(6))
            )
        codes = {r.status_code for r in replies}
        assert codes <= {200, 429}, codes
        busy = [r for r in replies if r.status_code == 429]
        assert busy and all(int(r.headers["retry-after"]) >= 1 for r in busy)
        return 429

    check(server, "fill-mask burst of 6 x 1,024 masks", burst, 429)


def test_half_megabyte_document_then_a_search_that_returns_it(server):
    rng = random.Random(0)
    words = ["vaccine", "immune", "protein", "antibody", "virus", "cell", "response", "study"]
    text = "zebrafishology " + " ".join(rng.choice(words) for _ in range(70_000))
    assert 500_000 < len(text) < 600_000
    document = [{"id": "big-doc", "text": text, "metadata": {"kind": "big"}}]
    check(server, "upsert one 550 KB document", lambda h: h.put("/documents", json=document), 200)
    found = check(
        server,
        "search returning the 550 KB document (include_text)",
        lambda h: h.post("/search", json={"query": "zebrafishology", "mode": "bm25", "include_text": True}),
        200,
    )
    assert found.json()["results"][0]["id"] == "big-doc"
    assert server.http.delete("/documents/big-doc").status_code == 200


def test_document_over_its_own_limit_is_422(server):
    document = [{"id": "too-big", "text": "word " * 240_000}]  # 1.2 M characters, under the body limit
    reply = check(server, "document of 1.2 M characters", lambda h: h.put("/documents", json=document), 422)
    assert field_of(reply) == "0.text"


def test_random_word_bm25_queries_leave_no_lasting_memory(server):
    rng = random.Random(1)
    queries = [
        " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 12))) for _ in range(60))
        for _ in range(300)
    ]
    for query in queries[:20]:  # warm-up: allocator arenas, caches of the ordinary kind
        server.http.post("/search", json={"query": query, "mode": "bm25"})
    before = server.status()["VmRSS"]

    def run(http: httpx.Client) -> int:
        for query in queries[20:]:
            assert http.post("/search", json={"query": query, "mode": "bm25"}).status_code == 200
        return 200

    check(server, "280 BM25 queries of 60 random words", run, 200)
    growth = server.status()["VmRSS"] - before
    MEASURED["280 BM25 queries of 60 random words"]["rss_growth_mb"] = round(growth, 1)
    assert growth < 20, f"RSS grew {growth:.1f} MB over 280 random-word queries"


def test_metadata_nested_300_levels_is_refused_and_stores_nothing(server):
    nested: dict = {}
    node = nested
    for _ in range(300):
        node["a"] = {}
        node = node["a"]
    document = [{"id": "deep", "text": "deep metadata", "metadata": nested}]
    reply = check(server, "metadata nested 300 levels", lambda h: h.put("/documents", json=document), 422)
    assert field_of(reply) == "body" or "metadata" in (field_of(reply) or "")
    nine = {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}
    reply = check(
        server,
        "metadata nested 9 levels",
        lambda h: h.put("/documents", json=[{**document[0], "metadata": nine}]),
        422,
    )
    assert field_of(reply).startswith("0.metadata")
    wide = {f"k{i}": i for i in range(300)}
    reply = check(
        server,
        "metadata with 300 keys",
        lambda h: h.put("/documents", json=[{**document[0], "metadata": wide}]),
        422,
    )
    assert field_of(reply) == "0.metadata"
    assert server.http.get("/documents/deep").status_code == 404


@pytest.mark.parametrize(
    ("name", "filter_", "field"),
    [
        ("filter int 10**30", {"year": 10**30}, "filter.year"),
        ("filter list of 300,000 values", {"year": list(range(300_000))}, "body"),  # CLOZE_MAX_BODY_VALUES
        ("filter 1e999 (infinity)", None, "filter.year"),
    ],
)
def test_filter_values_out_of_range_are_422(server, name, filter_, field):
    if filter_ is None:
        content = b'{"query": "vaccine", "filter": {"year": 1e999}}'
    else:
        content = json.dumps({"query": "vaccine", "filter": filter_}).encode()
    headers = {"content-type": "application/json"}
    reply = check(server, name, lambda h: h.post("/search", content=content, headers=headers), 422)
    assert field_of(reply) == field


# ---- bad values: 4xx naming the field, never 500 ------------------------------------------------------

RAW_CASES = [
    ("NaN in a filter", b'{"query": "x", "filter": {"year": NaN}}', 422, "body"),
    ("duplicate key", b'{"query": "x", "query": "y"}', 422, "query"),
    ("lone surrogate in the query", b'{"query": "\\ud800 vaccine"}', 422, "query"),
    ("nested 100,000 lists", b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 422, "body"),
    ("a 5,000-digit integer", b'{"query": "x", "top_k": ' + b"9" * 5000 + b"}", 422, "body"),
    ("top_k 10**30", b'{"query": "x", "top_k": 1000000000000000000000000000000}', 422, "top_k"),
    ("query of the wrong type", b'{"query": {"a": 1}}', 422, "query"),
    ("whitespace-only query", b'{"query": " \\t\\n "}', 422, "query"),
    ("empty query", b'{"query": ""}', 422, "query"),
    ("not JSON at all", b"\xff\xfe\x00garbage", 422, None),
    ("a JSON array for an object", b"[1, 2, 3]", 422, None),
]


@pytest.mark.parametrize(("name", "content", "status", "field"), RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_bad_search_bodies_name_the_field(server, name, content, status, field):
    headers = {"content-type": "application/json"}
    reply = check(server, name, lambda h: h.post("/search", content=content, headers=headers), status)
    if field is not None:
        assert field_of(reply) == field, reply.json()


DOCUMENT_CASES = [
    ("whitespace-only document id", [{"id": "  ", "text": "t"}], "0.id"),
    ("document id of 513 characters", [{"id": "i" * 513, "text": "t"}], "0.id"),
    ("whitespace-only document text", [{"id": "d", "text": "\u00a0 \n"}], "0.text"),
    ("metadata of the wrong type", [{"id": "d", "text": "t", "metadata": [1, 2]}], "0.metadata"),
    (
        "metadata with an int past 64 bits",
        [{"id": "d", "text": "t", "metadata": {"n": 2**70}}],
        "0.metadata.n",
    ),
]


@pytest.mark.parametrize(("name", "body", "field"), DOCUMENT_CASES, ids=[c[0] for c in DOCUMENT_CASES])
def test_bad_documents_name_the_field(server, name, body, field):
    reply = check(server, name, lambda h: h.put("/documents", json=body), 422)
    assert field_of(reply) == field, reply.json()


def test_odd_unicode_is_served_not_crashed_on(server):
    texts = ["\u202e\u0000zero\u200bwidth", "🦠" * 200, "e\u0301" * 300, "\ufeff\ufffe\uffff"]
    for position, text in enumerate(texts):
        name = f"odd unicode #{position}"
        check(server, f"{name} search", lambda h, t=text: h.post("/search", json={"query": t}), 200)
        check(
            server,
            f"{name} embed",
            lambda h, t=text: h.post("/embed", json={"inputs": t, "truncate": True}),
            200,
        )
        key = "".join(c for c in text[:5] if c >= " ")  # a NUL in a key is refused (the next section)
        body = [{"id": f"odd-{position}", "text": text, "metadata": {key: text[:5]}}]
        check(server, f"{name} upsert", lambda h, b=body: h.put("/documents", json=b), 200)
        got = server.http.get(f"/documents/odd-{position}")
        assert got.status_code == 200 and got.json()["text"] == text


# ---- issue 42: work bounded before validation, canonical ids and keys, no 500 on odd headers ---------


def healthz_while(server: Server, send) -> tuple[httpx.Response, float]:
    """``send`` in a thread while /healthz is polled: (its reply, the slowest /healthz seen meanwhile)."""
    slowest = 0.0
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(send, httpx.Client(base_url=server.url, timeout=120))
        while not pending.done():
            started = time.perf_counter()
            assert server.http.get("/healthz").status_code == 200
            slowest = max(slowest, time.perf_counter() - started)
            time.sleep(0.05)
        return pending.result(), slowest


BODY_BOUND_CASES = [
    ("PUT /documents of two million integers", "PUT", "/documents", b"[" + b"1," * 1_999_990 + b"1]", "body"),
    (
        "a filter of 300,000 empty lists",
        "POST",
        "/search",
        b'{"query": "x", "filter": {' + b",".join(b'"%x":[]' % i for i in range(300_000)) + b"}}",
        "body",
    ),
    (
        "PUT /documents of 90,000 wrong values (under the value bound)",
        "PUT",
        "/documents",
        b"[" + b"1," * 89_999 + b"1]",
        "0",
    ),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "content", "field"), BODY_BOUND_CASES, ids=[c[0] for c in BODY_BOUND_CASES]
)
def test_big_bodies_are_bounded_before_validation(server, name, method, path, content, field):
    headers = {"content-type": "application/json"}

    seen: dict[str, float] = {}

    def send(http: httpx.Client) -> httpx.Response:
        reply, seen["slowest_healthz_s"] = healthz_while(
            server, lambda h: h.request(method, path, content=content, headers=headers)
        )
        return reply

    reply = check(server, name, send, 422)
    assert field_of(reply) == field, reply.json()
    MEASURED[name]["slowest_healthz_s"] = round(seen["slowest_healthz_s"], 3)


def test_tokenize_is_bounded_by_its_answer(server):
    body = {"inputs": ["word " * 4000] * 195}  # 195 texts of 20,000 characters: a record per token back
    reply = check(server, "tokenize 195 x 20,000 characters", lambda h: h.post("/tokenize", json=body), 422)
    assert field_of(reply) == "inputs" and "100000" in reply.json()["error"]
    fits = {"inputs": ["word " * 4000] * 5}
    answer = check(server, "tokenize 5 x 20,000 characters", lambda h: h.post("/tokenize", json=fits), 200)
    assert len(answer.json()) == 5


def test_an_endless_header_is_cut_at_the_size_limit(server):
    port = int(server.url.rsplit(":", 1)[1])

    def endless(_: httpx.Client) -> int:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
            sent, chunk = 0, b"a" * 65_536
            try:
                while sent < 64 * 2**20:  # 64 MB: the run that found this got 89 MB in before its timeout
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:  # the server answered and closed
                pass
            MEASURED.setdefault("endless header", {})["bytes_sent"] = sent
            sock.settimeout(5)
            reply = b""
            try:
                while piece := sock.recv(4096):
                    reply += piece
            except OSError:
                pass
            # what was sent includes both sockets' kernel buffers (a few MB on loopback), not only what the
            # server read: after CLOZE_MAX_HEADER_BYTES it answered, then dropped at most LINGER_BYTES (12 MiB,
            # read and discarded so that the answer is not lost to a reset) before closing
            assert sent < 24 * 2**20, f"{sent} header bytes were accepted"
            return int(reply.split()[1]) if reply.startswith(b"HTTP/1.1") else 0

    check(server, "endless header", endless, 431)


@pytest.mark.parametrize("origin", ["http://localhost:99999", "http://[::1", "http://[::1]:8000:1"])
def test_a_malformed_origin_is_refused_not_a_500(server, origin):
    reply = check(server, f"Origin {origin}", lambda h: h.get("/search?q=x", headers={"Origin": origin}), 403)
    assert field_of(reply) == "Origin"
    lane = server.http.post("/embed", json={"inputs": "x"}, headers={"Origin": origin})
    assert lane.status_code == 403


def test_filters_are_bounded_as_a_whole_and_keys_that_cannot_round_trip_are_refused(server):
    wide = {f"f{i}": list(range(1024)) for i in range(64)}  # 64 x 1,024: "too many SQL variables", a 500
    reply = check(
        server,
        "filter of 64 fields x 1,024 values",
        lambda h: h.post("/search", json={"query": "x", "filter": wide}),
        422,
    )
    assert field_of(reply) == "filter"
    for key in ("a\x00b", 'say "hi"', "back\\slash"):
        filtered = server.http.post("/search", json={"query": "x", "filter": {key: 1}})
        assert filtered.status_code == 422 and field_of(filtered) == "filter", (key, filtered.text)
        stored = server.http.put("/documents", json=[{"id": "k", "text": "t", "metadata": {key: 1}}])
        assert stored.status_code == 422 and field_of(stored) == "0.metadata", (key, stored.text)
    assert server.http.get("/documents/k").status_code == 404


def test_ids_are_refused_unless_every_route_finds_them(server):
    for bad in ("nul\x00id", "tab\tid", "a/../b", "./x"):
        reply = server.http.put("/documents", json=[{"id": bad, "text": "refused id"}])
        assert reply.status_code == 422 and field_of(reply) == "0.id", (bad, reply.text)
    doc_id = "notes/2026/lighthouse.md"  # a path, as `cloze index build` of a folder names documents
    text = "the lighthouse keeper polished the great lens every evening"
    check(server, "id with slashes", lambda h: h.put("/documents", json=[{"id": doc_id, "text": text}]), 200)
    got = server.http.get(f"/documents/{doc_id}")
    assert got.status_code == 200 and got.json()["id"] == doc_id
    for mode in ("dense", "bm25", "hybrid"):
        hits = server.http.post("/search", json={"query": text, "mode": mode, "top_k": 3}).json()["results"]
        assert hits[0]["id"] == doc_id and len(hits) == 3, mode
    assert server.http.delete(f"/documents/{doc_id}").status_code == 200
    assert server.http.get(f"/documents/{doc_id}").status_code == 404


# ---- bodies and connections ---------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("POST", "/embed"), ("PUT", "/documents")])
def test_chunked_body_over_the_limit_is_413(server, method, path):
    def chunks() -> Iterator[bytes]:
        yield b'{"inputs": "'
        for _ in range(50):
            yield b"a" * 100_000  # 5 MB in all, over the 4 MB limit; no Content-Length
        yield b'"}'

    headers = {"content-type": "application/json"}
    name = f"chunked 5 MB {method} {path}"
    reply = check(server, name, lambda h: h.request(method, path, content=chunks(), headers=headers), 413)
    assert field_of(reply) == "body" and MEASURED[name]["seconds"] < 10, MEASURED[name]
    declared = check(
        server,
        "Content-Length of 5 MB",
        lambda h: h.post("/embed", content=b"{" + b" " * 5_000_000 + b"}", headers=headers),
        413,
    )
    # Answered before the body is read: the server closes with the client still sending, and the reset
    # can cost the client the answer's body (its status has arrived), so the body is checked when present.
    if declared.content:
        assert declared.headers["content-type"] == "application/json", (
            declared.headers,
            declared.content[:200],
        )
        assert field_of(declared) == "body"


@pytest.mark.parametrize("size", [1_000_000, 10_000_000])
def test_a_huge_url_gets_431_not_a_reset(server, size):
    port = int(server.url.rsplit(":", 1)[1])

    def ask(_: httpx.Client) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", "/search?q=" + "a" * size)  # httpx refuses such a URL itself
            answer = connection.getresponse()
            assert b"over the size limit" in answer.read()
            return answer.status
        finally:
            connection.close()

    check(server, f"a {size // 1_000_000} MB URL", ask, 431)


def test_a_client_gone_mid_upload_is_499_not_an_error(server):
    port = int(server.url.rsplit(":", 1)[1])
    for method, path in (("POST", "/collections/default/restore"), ("PUT", "/documents")):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3000000\r\n"
            sock.sendall(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + b"\0" * 500_000)
            time.sleep(0.5)
    wanted = [
        'cloze_requests_total{method="POST",route="/collections/{collection}/restore",status="499"}',
        'cloze_requests_total{method="PUT",route="/documents",status="499"}',  # labelled by its template
    ]
    for _ in range(50):  # the server notices a closed socket at its next read
        metrics = server.http.get("/metrics").text
        if all(line in metrics for line in wanted):
            break
        time.sleep(0.1)
    assert all(line in metrics for line in wanted), [line for line in metrics.splitlines() if "499" in line]
    assert 'status="500"' not in metrics
    assert "unhandled error" not in server.log.read_text()


def test_trickled_headers_are_cut_off(server):
    port = int(server.url.rsplit(":", 1)[1])

    def trickle(_: httpx.Client) -> int:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            started = time.monotonic()
            try:
                while time.monotonic() - started < 4 * HEADER_TIMEOUT_S:
                    sock.sendall(b"X-Slow: 1\r\n")
                    time.sleep(0.25)
            except OSError:  # the server closed the socket
                return 408
            sock.settimeout(1)
            try:
                return 408 if sock.recv(1) == b"" else 200
            except OSError:
                return 408

    check(server, "headers trickled for 8 s", trickle, 408)
    idle = socket.create_connection(("127.0.0.1", port))  # connects, then sends nothing
    idle.settimeout(3 * HEADER_TIMEOUT_S)
    assert idle.recv(1) == b"", "a silent connection stays open"
    idle.close()


COMMON_WORDS = " ".join(
    "government people states nation congress war peace country world law public great united power "
    "american free time years union constitution rights duty citizens interests policy trade business "
    "labor money tax revenue system national foreign service army navy justice liberty freedom security "
    "economy progress future history children schools health cities farmers workers industry credit debt "
    "budget treaty territory commerce land office courts".split()
)


def test_search_overload_is_429_not_a_queue(server):
    def burst(_: httpx.Client) -> int:
        # Each search costs several milliseconds whatever the index's size (61 common terms, 100 highlighted
        # hits), so 48 at once overrun the pool's 8 pending places on the demo slice too.
        body = {"query": COMMON_WORDS, "mode": "bm25", "top_k": 100, "highlight": True}
        with ThreadPoolExecutor(48) as pool:
            replies = list(
                pool.map(lambda _: httpx.post(server.url + "/search", json=body, timeout=60), range(96))
            )
        codes = [r.status_code for r in replies]
        assert set(codes) <= {200, 429}, codes
        assert 429 in codes and all("retry-after" in r.headers for r in replies if r.status_code == 429)
        return 429

    check(server, "96 concurrent BM25 searches (CLOZE_MAX_PENDING=8)", burst, 429)


# ---- browser guards in keyless loopback mode ----------------------------------------------------------


def test_dns_rebinding_host_is_refused(server):
    reply = check(
        server,
        "Host: evil.example",
        lambda h: h.get("/search?q=vaccine", headers={"Host": "evil.example"}),
        403,
    )
    assert field_of(reply) == "Host"
    assert server.http.get("/search?q=vaccine", headers={"Host": "localhost:1234"}).status_code == 200
    for path, body in (("/embed", {"inputs": "x"}), ("/v1/embeddings", {"input": "x"})):  # the fast lane
        lane = server.http.post(path, json=body, headers={"Host": "evil.example"})
        assert lane.status_code == 403 and field_of(lane) == "Host", (path, lane.text)
        strict = server.http.post(path, content=b'{"inputs": "a", "inputs": "b", "input": "c"}')
        assert strict.status_code == 422, (path, strict.text)  # duplicate keys, as on every other route


def test_cross_site_pages_cannot_drive_the_service(server):
    evil = {"Origin": "http://evil.example"}
    reply = check(
        server,
        "cross-origin POST /search",
        lambda h: h.post("/search", json={"query": "x"}, headers=evil),
        403,
    )
    assert field_of(reply) == "Origin"
    form = {"content-type": "application/x-www-form-urlencoded"}
    check(
        server,
        "form POST /index/rebuild",
        lambda h: h.post("/index/rebuild", content=b"a=1", headers=form),
        415,
    )
    text = {"content-type": "text/plain"}
    check(
        server, "text/plain PUT /documents", lambda h: h.put("/documents", content=b"[]", headers=text), 415
    )
    cross = {"Sec-Fetch-Site": "cross-site"}
    check(server, "Sec-Fetch-Site cross-site DELETE", lambda h: h.delete("/documents/x", headers=cross), 403)
    same = {"Origin": server.url}  # the playground itself
    assert server.http.post("/search", json={"query": "vaccine"}, headers=same).status_code == 200


# ---- restore trusts only what it checks itself ------------------------------------------------------------

RESTORE_RSS_JUMP_MB = 150  # the 338-byte FAISS file declaring 2^28 floats cost 1 GiB before


@pytest.fixture(scope="module")
def good_archive(server) -> bytes:
    """A real snapshot of a small collection of the served model, downloaded as a client would."""
    assert server.http.post("/collections", json={"name": "hostile"}).status_code == 201
    docs = [{"id": f"h{i}", "text": f"lighthouse keeper number {i} polished the lens"} for i in range(12)]
    assert server.http.put("/collections/hostile/documents", json=docs).status_code == 200
    made = server.http.post("/collections/hostile/snapshots")
    assert made.status_code == 201, made.text
    return server.http.get(f"/collections/hostile/snapshots/{made.json()['name']}").content


def test_hostile_archives_are_refused_before_anything_is_published(server, good_archive):
    """Each case: its status and the words naming the problem, no server path in the answer, no RSS jump,
    and the collection still searches; the good archive restores after them all."""
    headers = {"content-type": "application/octet-stream"}
    for case, (body, status, words) in hostile_archives(good_archive).items():
        name = f"restore: {case}"
        before = server.status()["VmRSS"]
        send = lambda h, body=body: h.post("/collections/hostile/restore", content=body, headers=headers)  # noqa: E731
        reply = check(server, name, send, status)
        error = reply.json()["error"]
        assert words in error and reply.json()["field"] == "archive", (case, error)
        assert ".upload-" not in error and "/collections/" not in error and "/tmp" not in error, error
        assert MEASURED[name]["peak_rss_mb"] - before < RESTORE_RSS_JUMP_MB, MEASURED[name]
        search = {"query": "lighthouse lens", "mode": "hybrid"}
        searched = server.http.post("/collections/hostile/search", json=search)
        assert searched.status_code == 200 and len(searched.json()["results"]) == 10, searched.text
    good = server.http.post("/collections/hostile/restore", content=good_archive, headers=headers)
    assert good.status_code == 200 and good.json()["documents"] == 12, good.text


def test_a_restore_never_reads_the_archives_faiss_file(server, good_archive):
    """A FAISS file that lies (another shape, 2^28 floats declared in 338 bytes, not FAISS) is never read:
    FAISS is rebuilt from the imported vectors, with no RSS jump, and the collection searches."""
    headers = {"content-type": "application/octet-stream"}
    for case, body in neutralised_archives(good_archive).items():
        name = f"restore: {case}"
        before = server.status()["VmRSS"]
        send = lambda h, body=body: h.post("/collections/hostile/restore", content=body, headers=headers)  # noqa: E731
        assert check(server, name, send, 200).json()["documents"] == 12, case
        assert MEASURED[name]["peak_rss_mb"] - before < RESTORE_RSS_JUMP_MB, MEASURED[name]
        search = {"query": "lighthouse lens", "mode": "dense"}
        searched = server.http.post("/collections/hostile/search", json=search)
        assert searched.status_code == 200 and len(searched.json()["results"]) == 10, searched.text


# ---- factories and other unbounded work ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        ("IVF2000000000,Flat", "IVF lists"),  # a 500 (MemoryError) before
        ("IVF4000000,Flat", "IVF lists"),  # 201 after 611 MiB before
        ("HNSW1000000", "HNSW M"),  # 190 MiB that stayed, for 24 one-line documents
        ("NSG64", "not one of the factories"),  # the first PUT was a 500 although stored
        ("HNSW2000000000", "HNSW M"),
    ],
)
def test_factories_outside_the_grammar_are_422_naming_the_field(server, factory, words):
    body = {"name": "factory-probe", "factory": factory}
    reply = check(server, f"collection factory {factory}", lambda h: h.post("/collections", json=body), 422)
    assert field_of(reply) == "factory" and words in reply.json()["error"], reply.text
    assert server.http.get("/collections/factory-probe").status_code == 404


def test_chunk_overlap_fusion_k_and_large_pages_are_bounded(server):
    overlap = {"name": "overlap-probe", "chunk_window": 64, "chunk_overlap": 63}  # a stride of one token
    reply = check(server, "chunk_overlap window - 1", lambda h: h.post("/collections", json=overlap), 422)
    assert field_of(reply) == "chunk_overlap" and "0..32" in reply.json()["error"], reply.text
    fusion = b'{"query": "x", "mode": "hybrid", "fusion": {"method": "rrf", "k": 1' + b"0" * 309 + b"}}"
    headers = {"content-type": "application/json"}
    reply = check(
        server, "fusion k 10**309", lambda h: h.post("/search", content=fusion, headers=headers), 422
    )
    assert field_of(reply) == "fusion.k", reply.text

    assert server.http.post("/collections", json={"name": "large-pages"}).status_code == 201
    text = "lighthouse " * 36_000  # 396 KB each; CLOZE_MAX_PAGE_BYTES is 700,000 in this suite
    docs = [{"id": f"big{i:02}", "text": text} for i in range(3)]
    assert server.http.put("/collections/large-pages/documents", json=docs).status_code == 200
    seen: list[str] = []
    cursor = None
    while True:
        query = "/collections/large-pages/documents?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        reply, slowest = healthz_while(server, lambda h, q=query: h.get(q))
        assert reply.status_code == 200 and len(reply.content) < 800_000, len(reply.content)
        assert slowest < 1.0, slowest
        seen += [d["id"] for d in reply.json()["documents"]]
        if (cursor := reply.json()["next_cursor"]) is None:
            break
    assert seen == [f"big{i:02}" for i in range(3)]
    page = "/collections/large-pages/documents?limit=1000"
    check(server, "GET /documents?limit=1000 of 400 KB documents", lambda h: h.get(page), 200)
    search = {"query": "lighthouse", "mode": "bm25", "include_text": True, "top_k": 3}
    reply = check(
        server,
        "search showing 3 x 400 KB texts",
        lambda h: h.post("/collections/large-pages/search", json=search),
        422,
    )
    assert field_of(reply) == "include_text", reply.text
    one = server.http.post("/collections/large-pages/search", json=search | {"top_k": 1})
    assert one.status_code == 200 and len(one.json()["results"][0]["text"]) == len(text)


# ---- liveness and readiness tell the truth --------------------------------------------------------------


def test_a_model_that_never_loads_is_retried_then_reported_failed(tmp_path):
    env = {
        "CLOZE_INDEX": str(tmp_path / "idx"),
        "CLOZE_MODEL": str(tmp_path / "no-such-model"),
        "CLOZE_MODEL_LOAD_ATTEMPTS": "3",  # backoff 1 s + 2 s: healthz is 200 meanwhile
    }
    with serve_process(env, tmp_path / "log", ready_path="/healthz", timeout=120) as (url, _):
        seen = []
        for _ in range(240):
            health = httpx.get(url + "/healthz", timeout=5)
            seen.append(health.status_code)
            if health.status_code == 503:
                break
            time.sleep(0.25)
        assert seen[0] == 200 and health.status_code == 503 and health.json()["status"] == "failed"
        ready = httpx.get(url + "/readyz", timeout=5)
        assert ready.status_code == 503 and ready.json()["attempts"] == 3
        assert "no-such-model" in ready.json()["reason"] and "retry-after" not in ready.headers
        assert httpx.post(url + "/embed", json={"inputs": "x"}, timeout=5).status_code == 503
