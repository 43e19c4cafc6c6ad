"""Keys (401 vs 403), request limits with named fields, overload, and refusing an open public bind."""

from __future__ import annotations

import random
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import READ_KEY, WRITE_KEY, running_server


def test_keys_distinguish_missing_unknown_and_insufficient(server):
    body = {"inputs": "hello"}
    assert httpx.post(server + "/embed", json=body).status_code == 401
    assert (
        httpx.post(server + "/embed", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    )
    read = {"Authorization": f"Bearer {READ_KEY}"}
    assert httpx.post(server + "/embed", json=body, headers=read).status_code == 200
    document = [{"id": "k1", "text": "some text"}]
    assert httpx.put(server + "/documents", json=document, headers=read).status_code == 403
    write = {"Authorization": f"Bearer {WRITE_KEY}"}
    assert httpx.post(server + "/embed", json=body, headers=write).status_code == 200  # write keys also read
    assert httpx.get(server + "/healthz").status_code == 200  # probes stay open
    assert httpx.get(server + "/readyz").json() == {"status": "ready", "ready": True}  # and say no more
    # With read keys set everything else needs one: /metrics names files and sizes.
    for path in ("/metrics", "/models", "/index/fields"):
        assert httpx.get(server + path).status_code == 401, path
        assert httpx.get(server + path, headers=read).status_code == 200, path


def test_limits_name_the_field(client):
    empty = client.post("/embed", json={"inputs": []})
    assert (empty.status_code, empty.json()["field"]) == (422, "inputs")
    too_many = client.post("/embed", json={"inputs": ["x"] * 65})
    assert too_many.status_code == 422 and "64" in too_many.json()["error"]
    too_long = client.post("/embed", json={"inputs": ["ok", "y" * 5001]})
    assert (too_long.status_code, too_long.json()["field"]) == (422, "inputs[1]")
    blank = client.post("/embed", json={"inputs": ["  "]})
    assert blank.status_code == 422
    huge = client.post(
        "/embed",
        content=b'{"inputs": "' + b"z" * 300_000 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert huge.status_code == 413
    malformed = client.post("/embed", content=b'{"inputs": ', headers={"content-type": "application/json"})
    assert malformed.status_code == 422
    not_utf8 = client.post(
        "/embed", content=b'{"inputs": "\xff\xfe"}', headers={"content-type": "application/json"}
    )
    assert 400 <= not_utf8.status_code < 500
    unknown_field = client.post("/embed", json={"inputs": "a", "colour": 1})
    assert unknown_field.status_code == 422 and unknown_field.json()["field"] == "colour"


def test_overload_is_429_with_retry_after(server_env, tmp_path):
    env = {**server_env, "CLOZE_MAX_QUEUE": "2", "CLOZE_INDEX": str(tmp_path / "idx")}
    with running_server(env, tmp_path / "log", ready_path="/healthz") as url:
        headers = {"Authorization": f"Bearer {READ_KEY}"}
        for _ in range(240):
            reply = httpx.post(url + "/embed", json={"inputs": ["a", "b", "c"]}, headers=headers, timeout=30)
            if reply.status_code != 503:  # still loading
                break
        assert reply.status_code == 429
        assert int(reply.headers["retry-after"]) >= 1 and "busy" in reply.json()["error"]


def test_refuses_public_bind_without_keys():
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        env={"PATH": "/usr/bin:/bin", "CLOZE_API_KEYS": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "CLOZE_API_KEYS" in result.stderr


def test_read_keys_alone_close_writes(tiny_bert, tmp_path):
    """Issue 42: with only read keys set, PUT and DELETE without any key answered 200."""
    env = {
        "CLOZE_MODEL": str(tiny_bert),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_INDEX": str(tmp_path / "idx"),
        "CLOZE_READ_API_KEYS": READ_KEY,
    }
    with running_server(env, tmp_path / "log") as url:
        read = {"Authorization": f"Bearer {READ_KEY}"}
        document = [{"id": "w", "text": "a write"}]
        for headers, status in (({}, 401), ({"Authorization": "Bearer nope"}, 401), (read, 403)):
            assert httpx.put(url + "/documents", json=document, headers=headers).status_code == status
            assert httpx.delete(url + "/documents/w", headers=headers).status_code == status
            assert httpx.post(url + "/index/rebuild", headers=headers).status_code == status
            assert httpx.post(url + "/no/such/route", headers=headers).status_code == status
        assert "no write keys" in httpx.put(url + "/documents", json=document, headers=read).json()["error"]
        assert httpx.get(url + "/documents/w", headers=read).status_code == 404  # nothing was written
        assert httpx.get(url + "/search?q=x", headers={"Host": "evil.example", **read}).status_code == 200


ADMIN, UNICODE_KEY = "admin-key-0123456789", "schlüssel-ключ-0123456789"


def test_any_key_guards_reads_and_scoped_keys_see_only_their_collections(tiny_bert, tmp_path):
    """With a write key and keys scoped (write) to a and b, b's documents answered 200 without a key and a's
    key could search b and list b's snapshots; a key scoped away from default read default's manifest and
    the models' folders through /models; error bodies named server folders. A key with non-ASCII characters
    matches as its client sends it. Then 300 requests to random model paths and random paths
    leave /metrics the size it was (the lane labelled metrics with the raw path)."""
    env = {
        "CLOZE_MODEL": str(tiny_bert),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_INDEX": str(tmp_path / "idx"),
        "CLOZE_API_KEYS": f"{ADMIN},{UNICODE_KEY}",
        "CLOZE_COLLECTION_API_KEYS": "ka=write:a,kb=write:b",
    }

    def call(method: str, path: str, key: str | None = None, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(method, url + path, headers=headers, timeout=30, **kwargs)

    with running_server(env, tmp_path / "log") as url:
        # b holds the caller's own vectors: scoped keys guard it as they guard a collection with a model.
        for name, shape in (("a", {}), ("b", {"dimension": 2})):
            assert call("POST", "/collections", ADMIN, json={"name": name, **shape}).status_code == 201
            document = [
                {"id": name, "text": f"the document of {name}", **({"vector": [1, 0]} if shape else {})}
            ]
            assert call("PUT", f"/collections/{name}/documents", "k" + name, json=document).status_code == 200
        assert (
            call("PUT", "/collections/b/documents", "ka", json=[{"id": "x", "vector": [0, 1]}]).status_code
            == 403
        )
        assert (
            call("POST", "/collections/b/search", "kb", json={"vector": [1, 0]}).json()["results"][0]["id"]
            == "b"
        )
        assert call("POST", "/collections/b/snapshots", ADMIN).status_code == 201
        query = {"json": {"query": "document", "mode": "bm25"}}
        for method, path, kwargs in (
            ("GET", "/collections/b/documents", {}),
            ("POST", "/collections/b/search", query),
            ("GET", "/collections/b/snapshots", {}),
            ("GET", "/search?q=x", {}),
            ("GET", "/collections", {}),
            ("POST", "/embed", {"json": {"inputs": "x"}}),
        ):
            assert call(method, path, **kwargs).status_code == 401, path
        for path in ("/collections/b/documents", "/collections/b/snapshots", "/collections/b", "/documents"):
            assert call("GET", path, "ka").status_code == 403, path
        for path in ("/index/fields", "/collections/default/snapshots", "/search?q=x"):
            assert call("GET", path, "ka").status_code == 403, path
        assert call("POST", "/collections/b/search", "ka", **query).status_code == 403
        assert call("POST", "/collections/a/search", "ka", **query).json()["results"][0]["id"] == "a"
        scoped, admin = call("GET", "/models", "ka"), call("GET", "/models", ADMIN)
        assert scoped.json()["index"] is None and '"path"' not in scoped.text
        assert admin.json()["index"]["documents"] == 0 and '"path"' in admin.text
        garbage = call("POST", "/collections/a/restore", "ka", content=b"not an archive")
        assert garbage.status_code == 422 and str(tmp_path) not in garbage.text, garbage.text
        utf8 = {"Authorization": b"Bearer " + UNICODE_KEY.encode()}
        document = [{"id": "u", "text": "written with a unicode key"}]
        assert httpx.put(url + "/documents", json=document, headers=utf8).status_code == 200
        wrong = {"Authorization": b"Bearer " + UNICODE_KEY.replace("ü", "u").encode()}
        assert httpx.put(url + "/documents", json=document, headers=wrong).status_code == 401

        def hostile(seed: int) -> int:
            letters = "".join(random.Random(seed).choices(string.ascii_letters, k=3000))
            if seed % 2:
                return call("GET", f"/{letters}").status_code
            return call("POST", f"/models/{letters}/embed", ADMIN, json={"inputs": "x"}).status_code

        assert all(400 <= hostile(seed) < 500 for seed in range(2))  # each kind's series exists once
        before = len(call("GET", "/metrics", ADMIN).text)
        assert all(400 <= hostile(seed) < 500 for seed in range(2, 302))
        after = call("GET", "/metrics", ADMIN).text
        assert len(after) - before < 2000 and 'route="/models/{model}/embed"' in after


# ---- one keyed server on the tiny model: write, read and tenant keys ------------------------------------

TENANT_KEYS = "ka=write:a,kt=write:t"


@pytest.fixture(scope="module")
def keyed(tiny_bert, tmp_path_factory) -> Iterator[str]:
    """Write key ``ADMIN``, read key ``READ_KEY``, tenant keys ``ka`` (writes a) and ``kt`` (writes t)."""
    root = tmp_path_factory.mktemp("keyed")
    env = {
        "CLOZE_MODEL": str(tiny_bert),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_INDEX": str(root / "idx"),
        "CLOZE_COLLECTIONS_DIR": str(root / "collections"),
        "CLOZE_API_KEYS": ADMIN,
        "CLOZE_READ_API_KEYS": READ_KEY,
        "CLOZE_COLLECTION_API_KEYS": TENANT_KEYS,
    }
    with running_server(env, root / "log") as url:
        yield url


def keyed_call(url: str, method: str, path: str, key: str | None = None, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, url + path, headers=headers, timeout=30, **kwargs)


def test_a_tenant_key_changes_what_its_collection_holds_not_whether_it_exists(keyed):
    """A key scoped to collections could not create one but could DELETE its own (its snapshots then moved
    aside). Creating and deleting a collection need an unscoped write key; inside its collection a tenant
    key writes, snapshots and restores."""
    assert keyed_call(keyed, "POST", "/collections", ADMIN, json={"name": "t"}).status_code == 201
    document = [{"id": "d", "text": "a tenant's document"}]
    assert keyed_call(keyed, "PUT", "/collections/t/documents", "kt", json=document).status_code == 200
    assert keyed_call(keyed, "POST", "/collections/t/snapshots", "kt").status_code == 201
    assert keyed_call(keyed, "POST", "/collections", "kt", json={"name": "t2"}).status_code == 403
    refused = keyed_call(keyed, "DELETE", "/collections/t", "kt")
    assert refused.status_code == 403 and "unscoped" in refused.json()["error"], refused.text
    assert keyed_call(keyed, "GET", "/collections/t", "kt").json()["documents"] == 1
    assert len(keyed_call(keyed, "GET", "/collections/t/snapshots", "kt").json()["snapshots"]) == 1
    assert keyed_call(keyed, "DELETE", "/collections/t", READ_KEY).status_code == 403
    assert keyed_call(keyed, "DELETE", "/collections/t", ADMIN).status_code == 200


def test_readyz_answers_probes_without_a_key_and_shows_each_key_only_its_collections(keyed):
    """Orchestrators probe readiness without secrets: /readyz answered 401 once any key was set. It answers
    everyone its status and ready flag; a collection's status and errors (which name files) only to a key
    that may read that collection, the service-wide detail only to an unscoped key; /metrics stays keyed."""
    for name in ("a", "b"):
        assert keyed_call(keyed, "POST", "/collections", ADMIN, json={"name": name}).status_code == 201
    for key in (None, "no-such-key"):
        probe = keyed_call(keyed, "GET", "/readyz", key)
        assert (probe.status_code, probe.json()) == (200, {"status": "ready", "ready": True}), probe.text
    tenant = keyed_call(keyed, "GET", "/readyz", "ka").json()
    assert tenant["ready"] and set(tenant) == {"status", "ready", "collections"}
    assert set(tenant["collections"]) == {"a"} and tenant["collections"]["a"]["status"] == "ready"
    full = keyed_call(keyed, "GET", "/readyz", READ_KEY).json()
    assert full["ready"] and {"default", "a", "b"} <= set(full["collections"]) and "fill_mask" in full
    assert keyed_call(keyed, "GET", "/metrics").status_code == 401
    assert keyed_call(keyed, "GET", "/metrics", "ka").status_code == 403


@pytest.mark.parametrize(
    ("framing", "key", "status"),
    [("chunked", ADMIN, 413), ("content-length", ADMIN, 413), ("chunked", None, 401)],
)
def test_a_client_that_sends_its_whole_body_first_gets_the_refusal_and_the_end(keyed, framing, key, status):
    """A client that writes its whole body before reading (a raw socket, http.client) got the 413 of a
    chunked 5 MB `PUT /documents` into its buffer but never the connection's end: the server neither read
    the rest nor closed, so a client reading to the end waited for ever. Refused before its body was read,
    a request's connection is closed once what follows is drained (bounded, as nginx's lingering close)."""
    port = int(keyed.rsplit(":", 1)[1])
    body = b"[" + b" " * 5_000_000 + b"]"
    head = "PUT /documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Authorization: Bearer {key}\r\n" if key else ""
    if framing == "chunked":
        blocks = [body[i : i + 65_536] for i in range(0, len(body), 65_536)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(block), block) for block in blocks) + b"0\r\n\r\n"
        head += "Transfer-Encoding: chunked\r\n\r\n"
    else:
        payload, head = body, head + f"Content-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        started = time.monotonic()
        sock.sendall(head.encode() + payload)
        reply = b""
        while piece := sock.recv(65_536):  # to the end: the server must close
            reply += piece
        elapsed = time.monotonic() - started
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply[:200]
    assert elapsed < 3, f"{elapsed:.1f} s to the connection's end"


def answer_head(url: str, head: str, body: bytes = b"") -> tuple[bytes, bytes]:
    """Send ``head`` (and ``body``) on a raw socket and read the answer's status line and headers."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        sock.sendall(head.encode() + body)
        reply = b""
        while b"\r\n\r\n" not in reply and (piece := sock.recv(65_536)):
            reply += piece
    status, _, headers = reply.partition(b"\r\n\r\n")[0].partition(b"\r\n")
    return status, headers.lower()


@pytest.mark.parametrize(
    ("key", "path", "status"),
    [(None, "/documents", 401), (READ_KEY, "/documents", 403), ("ka", "/collections/t/documents", 403)],
)
def test_an_answer_sent_before_its_body_was_read_says_the_connection_closes(keyed, key, path, status):
    """A refusal answered before the request's body arrived ends the connection (the server drains the
    body and closes): without `connection: close` a keep-alive client sent its next request onto it and got
    no answer (a soak's lifecycle saw `RemoteProtocolError` on the snapshot after a refused upsert)."""
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 60\r\n"
    )
    head += f"Authorization: Bearer {key}\r\n\r\n" if key else "\r\n"
    line, headers = answer_head(keyed, head)  # the body never sent: the answer cannot have waited for it
    assert line.startswith(f"HTTP/1.1 {status} ".encode()) and b"connection: close" in headers, (
        line,
        headers,
    )
    whole = b'[{"id": "kept", "text": "a document sent whole"}]'
    head = "PUT /documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(whole)}\r\nAuthorization: Bearer {ADMIN}\r\n\r\n"
    line, headers = answer_head(keyed, head, whole)
    assert line.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in headers, (line, headers)
