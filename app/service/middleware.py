"""ASGI middleware: request-size limit (413), the browser guard, request ids with one JSON log line per
request, metrics."""

from __future__ import annotations

import ipaddress
import itertools
import logging
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.service.auth import KeyRing, KeyScope, bearer_token
from app.service.errors import CLIENT_CLOSED, ApiError, known_error
from app.service.metrics import Metrics
from app.service.route_table import RouteTable
from app.settings import Settings

access_log = logging.getLogger("cloze.access")


async def send_json_bytes(
    send: Send, status: int, payload: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole JSON response as raw ASGI messages (for answers made outside FastAPI's routing)."""
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


async def send_error(send: Send, exc: Exception, headers: list[tuple[bytes, bytes]] | None = None) -> int:
    """An error answered outside FastAPI's handlers, mapped as they map it (``known_error``); its status."""
    status, body, more = known_error(exc) or (500, {"error": "internal error", "field": None}, None)
    encoded = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (more or {}).items()]
    await send_json_bytes(send, status, orjson.dumps(body), encoded + (headers or []))
    return status


async def read_body(scope: Scope, receive: Receive, max_bytes: int) -> bytes | None:
    """The whole request body; ``ApiError`` 413 past ``max_bytes`` (declared or as it arrives), None when
    the client goes away first."""
    declared = _header(scope, b"content-length")
    if declared and (not declared.isdigit() or int(declared) > max_bytes):
        raise ApiError(413, f"request body over the {max_bytes}-byte limit", "body")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, f"request body over the {max_bytes}-byte limit", "body")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# A refused body is not read: the connection ends after the answer (the server drains what follows, bounded:
# ``server.HeaderTimeoutProtocol``), and the client is told so.
CLOSE = [(b"connection", b"close")]


class CloseAfterUnreadBody:
    """An answer sent before its request's body was read (a refused key, an unknown collection, a 405) ends
    the connection, so it says ``connection: close``: the server drains the rest and closes
    (``server.HeaderTimeoutProtocol``), and a client that kept the connection for its next request got no
    answer to it (one snapshot in each soak, ``RemoteProtocolError``)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            return await self.app(scope, receive, send)
        read = False

        async def receiving() -> Message:
            nonlocal read
            message = await receive()
            read = read or message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def sending(message: Message) -> None:
            headers = message.get("headers", [])
            if message["type"] == "http.response.start" and not read and CLOSE[0] not in headers:
                message = {**message, "headers": [*headers, *CLOSE]}
            await send(message)

        return await self.app(scope, receiving, sending)


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    return _header(scope, b"transfer-encoding") is not None or (length is not None and length != b"0")


class BodySizeLimit:
    """413 for a body over ``max_bytes``: at once when its Content-Length says so, else as soon as a chunked
    body grows past it. The body is read here (at most ``max_bytes``) and handed on whole: a limit raised
    from inside ``receive`` reached FastAPI's body parsing as a 400, and Starlette's own limiter answers
    in plain text from outside this app's middleware. A route that declares a streamed body (a snapshot
    upload) has its own bound (``upload_bytes``) and is passed on unread: it streams the body to disk and
    counts it there."""

    def __init__(self, app: ASGIApp, max_bytes: int, routes: RouteTable, upload_bytes: int = 0):
        self.app, self.max_bytes, self.routes, self.upload_bytes = app, max_bytes, routes, upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.upload_bytes and self.routes.resolve(scope).streamed_body:
            declared = _header(scope, b"content-length")
            if declared and (not declared.isdigit() or int(declared) > self.upload_bytes):
                limit = f"{self.upload_bytes}-byte limit (CLOZE_MAX_SNAPSHOT_UPLOAD_BYTES)"
                await send_error(send, ApiError(413, f"archive over the {limit}", "body"), CLOSE)
                return None
            return await self.app(scope, receive, send)
        try:
            body = await read_body(scope, receive, self.max_bytes)
        except ApiError as exc:
            await send_error(send, exc, CLOSE)
            return None
        if body is None:
            return None
        pending: Message | None = {"type": "http.request", "body": body, "more_body": False}

        async def replay() -> Message:
            nonlocal pending
            if pending is not None:
                message, pending = pending, None
                return message
            return await receive()  # after the body: only a disconnect is left to come

        return await self.app(scope, replay, send)


class AccessGate:
    """Checks every HTTP request against what its route declared, before its body is read or a route runs."""

    def __init__(self, app: ASGIApp, keys: KeyRing, open_operations: bool, routes: RouteTable):
        self.app, self.keys, self.open_operations, self.routes = app, keys, open_operations, routes

    def check(self, scope: Scope) -> None:
        """Refuse (ApiError) or let through; a key scoped to collections is left in ``request.state.grant``
        for the routes that list collections; on /readyz (``probe``), what the caller's key may see."""
        declared = self.routes.resolve(scope)
        if declared.access == "public" or (declared.access == "operations" and self.open_operations):
            return
        if declared.access == "probe":  # open to orchestrators' probes, which carry no secret
            probing = None if self.open_operations else self.keys.caller(bearer_token(scope))
            scope.setdefault("state", {})["grant"] = probing
            return
        needed: KeyScope = "write" if declared.access in ("write", "admin") else "read"
        unscoped = declared.access in ("operations", "admin")
        grant = self.keys.check(bearer_token(scope), needed, declared.collection, unscoped)
        scope.setdefault("state", {})["grant"] = grant

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                self.check(scope)
            except ApiError as exc:
                await send_error(send, exc)
                return None
        return await self.app(scope, receive, send)


LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# The only bodies a cross-site HTML form (or a "simple" fetch) can send without a CORS preflight.
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")


def host_name(host: str) -> str:
    """``Host`` header -> its host name, lower-case, without port or IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _same_origin(origin: str, host: str) -> bool:
    """``Origin`` names the host the request was sent to. A ``Host`` without a port (a proxy that forwards
    ``$host``, as docker/nginx.conf does) matches that host on any port. A malformed ``Origin`` (a port past
    65535, an unclosed ``[``) names no host, so it is not the service's own."""
    try:
        parts = urlsplit(origin)
        origin_host, origin_port = parts.hostname, parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not origin_host:
        return False
    name = host_name(host)
    port = host.rsplit(":", 1)[1] if host.count(":") == 1 or host.startswith("[") and "]:" in host else None
    origin_port = origin_port or (443 if parts.scheme == "https" else 80)
    return origin_host == name and (port is None or str(origin_port) == port)


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class BrowserGuard:
    """What keeps a web page the user happens to visit from driving the service through their browser.

    - While reads need no key (no key of any kind set), the ``Host`` header must be a loopback name, an IP
      address or a name in ``CLOZE_ALLOWED_HOSTS``: a DNS-rebound name (evil.example -> 127.0.0.1, or -> the
      service's address on the user's network) gets 403, so a page cannot read through the browser. An
      IP address cannot be rebound: a page at one is the service's own origin.
    - A request whose ``Origin`` is neither the service's own nor in ``CLOZE_TRUSTED_ORIGINS`` gets 403
      (browsers send ``Origin`` on every cross-origin request but simple GETs).
    - Writes and other unsafe methods refuse form and text bodies (415) and ``Sec-Fetch-Site: cross-site``
      (403): a cross-site HTML form can send only those, without a preflight.
    """

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.reads_open = not (settings.api_keys or settings.read_api_keys or settings.collection_api_keys)
        self.allowed_hosts = {name.strip().lower() for name in settings.allowed_hosts}
        self.trusted = {origin.rstrip("/").lower() for origin in settings.trusted_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal is not None:
            await send_error(send, ApiError(*refusal))
            return None
        return await self.app(scope, receive, send)

    def host_allowed(self, name: str) -> bool:
        return (
            name in LOOPBACK_NAMES
            or _is_ip_address(name)
            or name in self.allowed_hosts
            or "*" in self.allowed_hosts
        )

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self.reads_open and not self.host_allowed(host_name(host)):
            return (
                403,
                f"Host {host!r} is not a loopback name, an IP address or in CLOZE_ALLOWED_HOSTS: while reads "
                "need no key this service answers only those (a guard against DNS rebinding)",
                "Host",
            )
        origin = headers.get("origin")
        if origin is not None:
            origin = origin.rstrip("/").lower()
            if not _same_origin(origin, host) and origin not in self.trusted:
                return (
                    403,
                    f"Origin {origin!r} may not call this service: add it to CLOZE_TRUSTED_ORIGINS",
                    "Origin",
                )
        if scope["method"] in UNSAFE_METHODS:
            if headers.get("sec-fetch-site") == "cross-site":
                return 403, "cross-site requests may not change anything", "Sec-Fetch-Site"
            content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if content_type in FORM_TYPES:
                return (
                    415,
                    f"Content-Type {content_type!r} refused: send application/json (cross-site form guard)",
                    "Content-Type",
                )
        return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


class RequestRecorder:
    """Request ids, request metrics and the access line of ``RequestLog``.

    On the event loop's path of every request, so it stays cheap (the lane's per-request cost is in
    docs/design-decisions.md, "the embedding lane"): ids are a per-process prefix and a counter rather than
    ``uuid4``, metric children are looked up once per (route, method, status), and the access line is written
    only when ``cloze.access`` logs at INFO (``CLOZE_ACCESS_LOG=false`` turns it off)."""

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
        """``route`` is a route's template (or ``unmatched``), never the raw path, and a method outside HTTP's
        own is ``other``: a client cannot grow /metrics without bound."""
        method = scope["method"] if scope["method"] in HTTP_METHODS else "other"
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
                "method": scope["method"],
                "path": scope["path"],
                "route": route,
                "status": status,
                "ms": round(elapsed * 1000, 2),
            }
            access_log.handle(
                access_log.makeRecord(access_log.name, logging.INFO, "", 0, "request", (), None, extra=fields)
            )


class RequestLog:
    """A request id (``X-Request-ID``, taken from the caller or made), one JSON access line, and metrics
    labelled by the route's template (``unmatched`` for a path no route answers), refused requests included."""

    def __init__(self, app: ASGIApp, recorder: RequestRecorder, routes: RouteTable):
        self.app, self.recorder, self.routes = app, recorder, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = self.recorder.request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        status: int | None = None
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            status = status or 500
            raise
        finally:
            # No answer started and nothing raised: the client went away first (a body read returned early).
            route = self.routes.resolve(scope).template
            final = status or CLIENT_CLOSED
            self.recorder.record(scope, route, final, time.perf_counter() - started, request_id)


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
