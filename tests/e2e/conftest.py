"""Session fixtures of the end-to-end tests: one keyed real server (harness.servers starts it)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from harness.servers import (  # noqa: F401  (re-exported for the test modules)
    READ_KEY,
    WRITE_KEY,
    free_port,
    running_server,
    serve_process,
    wait_until,
)


@pytest.fixture(scope="session")
def server_env(tmp_path_factory, tiny_bert) -> dict[str, str]:
    """Bundled model (auto backend), a fresh index, the tiny model for fill-mask mechanics, keys on."""
    return {
        "CLOZE_INDEX": str(tmp_path_factory.mktemp("index") / "idx"),
        "CLOZE_FILL_MASK_MODEL": str(tiny_bert),
        "CLOZE_API_KEYS": WRITE_KEY,
        "CLOZE_READ_API_KEYS": READ_KEY,
        "CLOZE_MAX_INPUTS": "64",
        "CLOZE_MAX_CHARS": "5000",
        "CLOZE_MAX_BODY_BYTES": "200000",
    }


@pytest.fixture(scope="session")
def server(server_env, tmp_path_factory) -> Iterator[str]:
    with running_server(server_env, tmp_path_factory.mktemp("logs") / "server.log") as url:
        yield url


@pytest.fixture(scope="session")
def client(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {WRITE_KEY}"}, timeout=60) as http:
        yield http
