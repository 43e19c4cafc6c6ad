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
