"""One error shape for every 4xx/5xx: ``{"error": message, "field": name-or-null}``."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from index.archive.snapshots import (
    ArchiveTooLarge,
    BadArchive,
    InvalidSnapshotName,
    SnapshotError,
    SnapshotInProgress,
    SnapshotNoSpace,
    SnapshotNotFound,
)
from index.records import InvalidDocument, ReadOnlyIndex, StorageError
from index.storage.layout import BuildInProgress

# Snapshot refusals: (status, field). Each message says what is wrong; nothing was written.
SNAPSHOT_ERRORS: dict[type[SnapshotError], tuple[int, str | None]] = {
    SnapshotInProgress: (409, None),
    SnapshotNoSpace: (507, None),
    SnapshotNotFound: (404, "snapshot"),
    InvalidSnapshotName: (422, "snapshot"),
    BadArchive: (422, "archive"),
    ArchiveTooLarge: (413, "archive"),
}

log = logging.getLogger("cloze.service")
# An absolute path of two parts or more, up to its last part: where the server keeps a file is not the
# client's business (the log has it), the file's own name may be (``store.sqlite``, a snapshot's).
SERVER_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+=-]+/)+(?=[\w.@+=-])")


def without_server_paths(message: str) -> str:
    """``index at /data/index/versions/3 failed`` -> ``index at …/3 failed``."""
    return SERVER_PATH.sub("…/", message)


CLIENT_CLOSED = 499  # nginx's "client closed request": no answer reached anyone, and it is not a server error


class BodyRejected(StarletteHTTPException):
    """A request body refused while parsing (FastAPI re-raises HTTP exceptions from there as they are)."""

    def __init__(self, message: str, field: str = "body"):
        super().__init__(422, message)
        self.field = field


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers


def _location(loc: tuple) -> str:
    # The first element is where the value came from; a field may itself be named "query" (/search's is).
    parts = [str(p) for p in (loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)]
    return ".".join(parts) or "body"


def validation_error(errors: list) -> tuple[str, str]:
    """(message, field) for the first of pydantic's errors, the same for FastAPI's and the lane's parsing."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    field = _location(tuple(first.get("loc", ())))
    return f"{field}: {first.get('msg')}", field


def known_error(exc: Exception) -> tuple[int, dict, dict[str, str] | None] | None:
    """(status, body, headers) for an error this service answers on purpose; None for a bug (500). The app's
    handlers and the embedding lane (which answers ahead of them) both map errors here."""
    known = _known_error(exc)
    if known is None:
        return None
    status, body, headers = known
    return status, {**body, "error": without_server_paths(body["error"])}, headers


def _known_error(exc: Exception) -> tuple[int, dict, dict[str, str] | None] | None:
    if isinstance(exc, ApiError):
        return exc.status, {"error": exc.message, "field": exc.field}, exc.headers
    if isinstance(exc, ReadOnlyIndex | BuildInProgress):
        return 409, {"error": str(exc), "field": None}, None
    if isinstance(exc, SnapshotError):
        status, field = SNAPSHOT_ERRORS.get(type(exc), (422, None))
        return status, {"error": str(exc), "field": field}, None
    if isinstance(exc, InvalidDocument):
        return 422, {"error": str(exc), "field": exc.field}, None
    if isinstance(exc, StorageError):
        # 507 Insufficient Storage for a full disk, 503 for other disk failures; nothing was written
        log.warning("write refused by the disk: %s", exc)
        return 507 if exc.full else 503, {"error": str(exc), "field": None}, {"Retry-After": "30"}
    return None


def method_not_allowed(request: Request) -> JSONResponse:
    """405 naming every method the path takes, in the message and in ``Allow`` (RFC 9110 requires it). The
    router raises it from the first route whose path matched, whose methods may be only some of the path's."""
    allowed = request.app.state.routes.allowed(request.url.path)
    message = f"{request.method} is not a method of {request.url.path}: it takes {', '.join(allowed)}"
    return JSONResponse({"error": message, "field": None}, 405, headers={"Allow": ", ".join(allowed)})


def list_expected(request: Request, errors: list) -> str | None:
    """For a route whose body is a list (PUT /documents) sent something else, often the list wrapped in an
    object as other services take it (``{"documents": [...]}``): say what the body must be. None otherwise."""
    first = errors[0] if errors else {}
    if first.get("type") != "list_type" or tuple(first.get("loc", ())) != ("body",):
        return None
    body_field = getattr(request.scope.get("route"), "body_field", None)
    noun = body_field.name if body_field is not None else "values"
    message = f"body: a list of {noun} is expected (a JSON array, [{{...}}, ...])"
    sent = first.get("input")
    if isinstance(sent, dict):
        wrapped = [key for key, value in sent.items() if isinstance(value, list)]
        named = f" under {wrapped[0]!r}" if wrapped else ""
        return f"{message}, not an object: send the array{named} itself as the body"
    return f"{message}, not {type(sent).__name__}"


def install_error_handlers(app: FastAPI) -> None:
    async def known(_: Request, exc: Exception) -> JSONResponse:
        status, body, headers = known_error(exc) or (500, {"error": "internal error", "field": None}, None)
        return JSONResponse(body, status, headers=headers)

    for kind in (ApiError, ReadOnlyIndex, InvalidDocument, StorageError, SnapshotError, BuildInProgress):
        app.add_exception_handler(kind, known)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_error(exc.errors())
        message = list_expected(request, exc.errors()) or message
        return JSONResponse({"error": message, "field": field}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return method_not_allowed(request)
        field = getattr(exc, "field", None)
        message = without_server_paths(str(exc.detail))
        return JSONResponse({"error": message, "field": field}, exc.status_code, headers=exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, _: ClientDisconnect) -> Response:
        log.info("the client went away during %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED)  # never delivered; counted as 499 in the metrics

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal error", "field": None}, 500)
