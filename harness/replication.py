"""Replication on loopback: a moto S3 server (paused with SIGSTOP as a bucket that stops answering), a TCP
proxy per server (cut: a network partition between it and the bucket; losing answers: a bucket that applies
requests whose answers never arrive), and the environment that makes `cloze serve` a writer or a replica.
Shared by tests/replication/ and benchmarks/replication.py."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3

from harness.servers import free_port

BUCKET = "cloze-replicas"
PREFIX = "loopback"  # replication_env's folder in the bucket
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


class MotoServer:
    """A real S3 API on a loopback port (moto's server), with one bucket."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        moto = Path(sys.executable).with_name("moto_server")
        self.process = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        client = self.client()
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                return
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.2)

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", **_lower(CREDENTIALS))

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        self.process.kill()
        self.process.wait(timeout=30)


def _lower(credentials: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
    }


class TcpProxy:
    """Forwards a loopback port to ``target``. ``cut()`` is a partition: open connections are reset and new
    ones are accepted but never answered; ``heal()`` resets those and forwards again. ``lose_answers()``
    forwards every request whole but drops what the bucket answers (``"drop"``: the client waits for its
    timeout) or closes the connection once it answers (``"close"``): the request has landed either way, as
    on a real store whose answer is lost (moto paused with SIGSTOP applies nothing); ``answer_again()``.
    ``delay_s``: every answer that late (a slow store)."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.is_cut = False
        self.losing: str | None = None  # "drop" or "close" while answers are lost
        self.delay_s = 0.0
        self._open: set[socket.socket] = set()
        self._guard = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._guard:
                self._open.add(client)
                if self.is_cut:
                    continue  # held open, never answered: what a client meets across a partition
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            self._close(client)
            return
        upstream.settimeout(None)
        with self._guard:
            self._open.add(upstream)
        for source, sink, answers in ((client, upstream, False), (upstream, client, True)):
            threading.Thread(target=self._pump, args=(source, sink, answers), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                # "100 Continue" passes: boto3 sends a put's body only after it (or after a pause)
                if answers and self.losing and not data.startswith(b"HTTP/1.1 100 "):
                    if self.losing == "close":
                        break  # the bucket answered, so the request landed: the connection just closes
                    continue
                if answers and self.delay_s:
                    time.sleep(self.delay_s)
                sink.sendall(data)
        except OSError:
            pass
        self._close(source)
        if not (answers and self.losing == "drop"):  # a dropped answer leaves the client to its timeout
            self._close(sink)

    def _close(self, sock: socket.socket) -> None:
        with self._guard:
            self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def _reset_all(self) -> None:
        with self._guard:
            doomed = list(self._open)
        for sock in doomed:
            self._close(sock)

    def cut(self) -> None:
        self.is_cut = True
        self._reset_all()

    def heal(self) -> None:
        self.is_cut = False
        self._reset_all()

    def lose_answers(self, how: str = "drop") -> None:
        assert how in ("drop", "close"), how
        self.losing = how

    def answer_again(self) -> None:
        """Fresh connections only: one whose answer was partly dropped would hand the client garbage."""
        self.losing = None
        self._reset_all()

    def close(self) -> None:
        self.listener.close()
        self._reset_all()


def replication_env(role: str, endpoint: str, **settings: str) -> dict[str, str]:
    """The variables that make `cloze serve` a writer or a replica of the default collection."""
    return {
        "CLOZE_REPLICATION_ROLE": role,
        "CLOZE_REPLICATION_BUCKET": f"s3://{BUCKET}/{PREFIX}",
        "CLOZE_REPLICATION_ENDPOINT": endpoint,
        "CLOZE_REPLICATION_REGION": "us-east-1",
        **CREDENTIALS,
        **{f"CLOZE_REPLICATION_{name.upper()}": value for name, value in settings.items()},
    }
