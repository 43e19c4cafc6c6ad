"""A real uvicorn server on a free port, started as the user starts it: `cloze serve` with CLOZE_* variables.

Shared by tests/ and benchmarks/ (neither imports the other).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

WRITE_KEY, READ_KEY = "test-write-key-0123456789", "test-read-key-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def serve_process(
    env: dict[str, str],
    log_path: Path,
    ready_path: str = "/readyz",
    timeout: float = 240,
    drop: tuple[str, ...] = (),
    checkout: Path = ROOT,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`cloze serve` on a free loopback port with this process's environment, ``HF_HUB_OFFLINE=1`` and
    ``env``, less the variables in ``drop``; yields (url, process) once ``ready_path`` answers 200, and
    stops the server with SIGTERM (as a supervisor would) at the end. ``checkout``: the tree the app is
    imported from (another checkout measures a commit before a change with the same script)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    for name in drop:
        full_env.pop(name, None)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=checkout,
        )
        try:
            key = (full_env.get("CLOZE_READ_API_KEYS") or full_env.get("CLOZE_API_KEYS") or READ_KEY).split(
                ","
            )[0]
            wait_until(url + ready_path, process, log_path, timeout, key)
            yield url, process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


@contextlib.contextmanager
def running_server(
    env: dict[str, str], log_path: Path, ready_path: str = "/readyz", timeout: float = 240
) -> Iterator[str]:
    with serve_process(env, log_path, ready_path, timeout) as (url, _):
        yield url


def wait_until(
    url: str, process: subprocess.Popen, log_path: Path, timeout: float, key: str = READ_KEY
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            # /readyz answers without a key too (its status code is the same); the key does no harm.
            if httpx.get(url, timeout=2, headers={"Authorization": f"Bearer {key}"}).status_code == 200:
                return
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {timeout}s:\n{log_path.read_text()[-4000:]}")
