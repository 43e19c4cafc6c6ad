"""What a newcomer reads in the log at start-up: uvicorn's "running" line comes while the models load and the
collections open, so the service says once, in its own line, when it is ready (when /readyz answers 200)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import running_server, serve_process


def messages(log_path: Path) -> list[str]:
    """The log's messages (JSON lines; anything else, say a warning printed by a library, as written)."""
    lines = log_path.read_text().splitlines()
    return [json.loads(line).get("msg", "") if line.startswith("{") else line for line in lines]


def test_the_log_says_ready_once_every_collection_is_open(tiny_bert, tmp_path):
    env = {
        "CLOZE_MODEL": str(tiny_bert),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_BACKEND": "torch",
        "CLOZE_INDEX": str(tmp_path / "index"),
    }
    with running_server(env, tmp_path / "first.log") as url:  # a second collection for the next start
        assert httpx.post(url + "/collections", json={"name": "second"}).status_code == 201

    log_path = tmp_path / "server.log"
    with serve_process(env, log_path, ready_path="/healthz") as (url, _):  # as soon as uvicorn answers
        deadline = time.monotonic() + 120
        while not (ready := [m for m in messages(log_path) if m.startswith("ready:")]):
            assert time.monotonic() < deadline, messages(log_path)[-20:]
            time.sleep(0.05)
        assert httpx.get(url + "/readyz").status_code == 200  # the line is never early
        time.sleep(2 * 2.0)  # two rounds of the lifecycle (RELOAD_EVERY_S): it is said once
        lines = messages(log_path)
    assert [m for m in lines if m.startswith("ready:")] == ready
    opened = re.match(r"ready: 2 collection\(s\) open \(([^)]*)\), [\d.]+ s after start-up$", ready[0])
    assert opened and sorted(opened[1].split(", ")) == ["default", "second"], ready
    running = next(i for i, m in enumerate(lines) if "Uvicorn running" in m)
    assert running < lines.index(ready[0])
