"""``EmbeddingLane``: ``POST /embed`` and ``POST /v1/embeddings`` answered as plain ASGI, in front of FastAPI.

On a 2-core host the event loop's time per request decides how close the service comes to the runtime's
offline rate. By per-thread CPU time under wrk (64 connections, one sentence a request; docs/benchmarks.md,
"Design measurements"): uvicorn alone answers a fixed body for about 20 us of event-loop time a request;
FastAPI's ``GET /healthz`` through our middleware, about 120 us; ``POST /embed`` as a FastAPI route, 470 us.
py-spy showed where: the middleware and exception layers each wrapping ``send``, the router, the request
object, dependency solving (a sync API-key dependency even hopped to the thread pool), the body parsed in
Python, and the response model validated and serialised 384 floats at a time. The lane does the same work
directly: the size limit, request id, API key, one ``model_validate_json`` with the route's own pydantic
model, the route's own function, and the same request metrics and access line (``RequestRecorder``).
Every other request, and every non-HTTP event (lifespan), goes to the FastAPI app unchanged; the FastAPI
declarations of these two routes stay for the OpenAPI schema and answer the same way without the lane."""

from __future__ import annotations

import logging
import time

import orjson
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from app.service.errors import ApiError, BodyRejected, validation_error
from app.service.middleware import AccessGate, BrowserGuard, RequestRecorder, send_json_bytes
from app.service.routes.inference import LANES
from app.service.validation import parse_body

log = logging.getLogger("cloze.service")


class EmbeddingLane:
    def __init__(self, app: FastAPI):
        self.app = app
        self.state = app.state
        self.recorder: RequestRecorder = app.state.recorder
        self.max_bytes: int = app.state.settings.max_body_bytes
        self.max_values: int = app.state.settings.max_body_values
        # The lane answers before the app's middleware, so it asks the same guard and gate.
        self.guard = BrowserGuard(app, app.state.settings)
        self.gate = AccessGate(app, app.state.keys, app.state.settings.open_operations)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = LANES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if lane is None:
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        request_id = self.recorder.request_id(scope)
        extra = [(b"x-request-id", request_id.encode("latin-1"))]
        model, answer = lane
        status = 500
        try:
            refusal = self.guard.refusal(scope)
            if refusal is not None:
                raise ApiError(*refusal)
            self.gate.check(scope)
            body = await self._body(scope, receive)
            try:
                request = model.model_validate(await parse_body(body, self.max_values))
            except BodyRejected as exc:
                raise ApiError(422, exc.detail, exc.field) from None
            except ValidationError as exc:
                message, field = validation_error(exc.errors(include_url=False))
                raise ApiError(422, message, field) from None
            response = await answer(request, self.state)
            status = response.status_code
            response.raw_headers.extend(extra)
            await response(scope, receive, send)
        except ApiError as exc:
            status = exc.status
            headers = [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (exc.headers or {}).items()
            ]
            await send_json_bytes(
                send, status, orjson.dumps({"error": exc.message, "field": exc.field}), headers + extra
            )
        except Exception:
            log.exception("unhandled error on POST %s", scope["path"])
            await send_json_bytes(send, 500, b'{"error":"internal error","field":null}', extra)
        finally:
            self.recorder.record(scope, scope["path"], status, time.perf_counter() - started, request_id)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        """The request body, refused with 413 past ``max_body_bytes`` (declared or as it arrives)."""
        too_large = ApiError(413, f"request body over the {self.max_bytes}-byte limit", "body")
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                raise too_large
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "the client went away before its request body arrived")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
