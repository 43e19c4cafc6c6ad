"""Keys (401 vs 403), request limits with named fields, overload, and refusing an open public bind."""

from __future__ import annotations

import subprocess
import sys

import httpx

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
    # With read keys set everything else needs one: /readyz's reasons and /metrics name files and sizes.
    for path in ("/readyz", "/metrics", "/models", "/index/fields"):
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


def test_open_reads_refuse_a_rebound_host_and_a_unicode_key_matches(tiny_bert, tmp_path):
    """Issue 42: with write keys set and reads open, a DNS-rebound page could read; a key with non-ASCII
    characters never matched (read as latin-1, compared as UTF-8)."""
    key = "schlüssel-ключ-0123456789"
    env = {
        "CLOZE_MODEL": str(tiny_bert),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_INDEX": str(tmp_path / "idx"),
        "CLOZE_API_KEYS": key,
        "CLOZE_ALLOWED_HOSTS": "search.internal",
    }
    with running_server(env, tmp_path / "log") as url:
        rebound = httpx.get(url + "/search?q=x", headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 403 and rebound.json()["field"] == "Host"
        lane = httpx.post(url + "/embed", json={"inputs": "x"}, headers={"Host": "evil.example"})
        assert lane.status_code == 403
        for host in ("127.0.0.1", "localhost:1", "search.internal:8000", "10.0.0.7:8000"):
            assert httpx.get(url + "/search?q=x", headers={"Host": host}).status_code == 200, host
        utf8 = {"Authorization": b"Bearer " + key.encode()}
        document = [{"id": "u", "text": "written with a unicode key"}]
        assert httpx.put(url + "/documents", json=document, headers=utf8).status_code == 200
        wrong = {"Authorization": b"Bearer " + key.replace("ü", "u").encode()}
        assert httpx.put(url + "/documents", json=document, headers=wrong).status_code == 401
        assert httpx.put(url + "/documents", json=document).status_code == 401
