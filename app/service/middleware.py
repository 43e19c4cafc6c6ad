"""ASGI middleware: request-size limit (413), request ids with one JSON log line per request, metrics."""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.service.metrics import Metrics

access_log = logging.getLogger("cloze.access")


class _TooLarge(Exception):
    pass


async def _send_json(
    send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class BodySizeLimit:
    """413 before reading a body whose Content-Length is too big, and while reading one that grows too big."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _header(scope, b"content-length")
        too_large = {"error": f"request body over the {self.max_bytes}-byte limit", "field": "body"}
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            return await _send_json(send, 413, too_large)
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _send_json(send, 413, too_large)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class RequestRecorder:
    """Request ids, request metrics and the access line, shared by ``RequestLog`` and ``EmbeddingLane``.

    Per request this is on the event loop's critical path, so it stays cheap: ids are a random per-process
    prefix and a counter (``uuid4`` read the OS's random source on every request: 4% of the loop's time on
    ``POST /embed`` in py-spy), metric children are looked up once per (route, method, status), and the
    access line is written only when ``cloze.access`` logs at INFO (``CLOZE_ACCESS_LOG=false`` turns it off)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self._prefix = secrets.token_hex(6)
        self._ids = itertools.count()
        self._counters: dict[tuple[str, str, str], Any] = {}
        self._histograms: dict[tuple[str, str], Any] = {}

    def request_id(self, scope: Scope) -> str:
        given = _header(scope, b"x-request-id")
        return given.decode("latin-1")[:64] if given else f"{self._prefix}-{next(self._ids):x}"

    def record(self, scope: Scope, route: str, status: int, elapsed: float, request_id: str) -> None:
        method = scope["method"]
        key = (route, method, str(status))
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.requests.labels(*key)
        histogram = self._histograms.get(key[:2])
        if histogram is None:
            histogram = self._histograms[key[:2]] = self.metrics.latency.labels(route, method)
        counter.inc()
        histogram.observe(elapsed)
        if access_log.isEnabledFor(logging.INFO):
            # makeRecord + handle: ``info()`` would also walk the stack to find its caller, on every request
            fields = {
                "request_id": request_id,
                "method": method,
                "path": scope["path"],
                "route": route,
                "status": status,
                "ms": round(elapsed * 1000, 2),
            }
            access_log.handle(
                access_log.makeRecord(access_log.name, logging.INFO, "", 0, "request", (), None, extra=fields)
            )


class RequestLog:
    """A request id (``X-Request-ID``, taken from the caller or made), one JSON access line, and metrics."""

    def __init__(self, app: ASGIApp, recorder: RequestRecorder):
        self.app, self.recorder = app, recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = self.recorder.request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.recorder.record(scope, route, status, time.perf_counter() - started, request_id)


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object per line, with any ``extra`` fields."""

    _standard = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._standard and k != "message"})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()
