"""One error shape for every 4xx/5xx: ``{"error": message, "field": name-or-null}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from index.records import InvalidDocument, ReadOnlyIndex, StorageError

log = logging.getLogger("cloze.service")


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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message, "field": exc.field}, exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_error(exc.errors())
        return JSONResponse({"error": message, "field": field}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = getattr(exc, "field", None)
        message = str(exc.detail)
        return JSONResponse({"error": message, "field": field}, exc.status_code, headers=exc.headers)

    @app.exception_handler(ReadOnlyIndex)
    async def read_only(_: Request, exc: ReadOnlyIndex) -> JSONResponse:
        return JSONResponse({"error": str(exc), "field": None}, 409)

    @app.exception_handler(InvalidDocument)
    async def invalid_document(_: Request, exc: InvalidDocument) -> JSONResponse:
        return JSONResponse({"error": str(exc), "field": exc.field}, 422)

    @app.exception_handler(StorageError)
    async def storage(_: Request, exc: StorageError) -> JSONResponse:
        # 507 Insufficient Storage for a full disk, 503 for other disk failures; nothing was written
        log.warning("write refused by the disk: %s", exc)
        status = 507 if exc.full else 503
        return JSONResponse({"error": str(exc), "field": None}, status, headers={"Retry-After": "30"})

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal error", "field": None}, 500)
