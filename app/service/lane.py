"""``EmbeddingLane``: ``POST /embed`` and ``POST /v1/embeddings`` answered as plain ASGI, in front of FastAPI.

Why: on a 2-core host the event loop's time per request decides how close the service comes to the runtime's
offline rate, and FastAPI's layers cost several times the route's own work (docs/benchmarks.md, "Design
measurements"). The lane does the same work directly, with the middleware's own pieces (browser guard, access
gate, body limit, error mapping, request recorder) and each route's own pydantic model and function. Every
other request, and every non-HTTP event (lifespan), goes to the FastAPI app unchanged; the FastAPI
declarations of these two routes stay for the OpenAPI schema and answer the same way without the lane."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from app.service.errors import CLIENT_CLOSED, ApiError, BodyRejected, validation_error
from app.service.middleware import AccessGate, BrowserGuard, RequestRecorder, read_body, send_error
from app.service.model_registry import split_model_route
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
        named, route = split_model_route(scope["path"]) if scope["type"] == "http" else (None, "")
        lane = LANES.get(route) if scope["type"] == "http" and scope["method"] == "POST" else None
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
            body = await read_body(scope, receive, self.max_bytes)
            if body is None:
                raise ApiError(CLIENT_CLOSED, "the client went away before its request body arrived")
            try:
                request = model.model_validate(await parse_body(body, self.max_values))
            except BodyRejected as exc:
                raise ApiError(422, exc.detail, exc.field) from None
            except ValidationError as exc:
                message, field = validation_error(exc.errors(include_url=False))
                raise ApiError(422, message, field) from None
            response = await answer(request, self.state, named)
            status = response.status_code
            response.raw_headers.extend(extra)
            await response(scope, receive, send)
        except Exception as exc:
            if not isinstance(exc, ApiError):
                log.exception("unhandled error on POST %s", scope["path"])
            status = await send_error(send, exc, extra)
        finally:
            self.recorder.record(scope, scope["path"], status, time.perf_counter() - started, request_id)
