"""``EmbeddingLane``: ``POST /embed``, ``/models/{model}/embed`` and ``/v1/embeddings`` answered as plain ASGI
endpoints, routed ahead of FastAPI's declarations of the same routes.

Why: on a 2-core host the event loop's time per request decides how close the service comes to the runtime's
offline rate, and FastAPI's request handling (dependencies, body parsing, response validation) costs several
times the route's own work (docs/design-decisions.md, "the embedding lane"). The lane parses with the route's
own pydantic model and answers with the route's own function. It is a route like the others: every request
to it passes the whole middleware stack (browser guard, access gate, body limit, request log and metrics),
and it declares what FastAPI's route of the same path declares. The FastAPI routes stay for the OpenAPI
schema and answer the same way where no lane is installed (``create_app(lane=False)``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.datastructures import State
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from app.service.errors import CLIENT_CLOSED, ApiError, BodyRejected, validation_error
from app.service.middleware import read_body
from app.service.route_table import RouteTable
from app.service.routes.inference import LANES, LaneAnswer
from app.service.validation import parse_body


class EmbeddingLane:
    def __init__(self, state: State, model: type[BaseModel], answer: LaneAnswer):
        self.state, self.model, self.answer = state, model, answer
        self.max_bytes: int = state.settings.max_body_bytes
        self.max_values: int = state.settings.max_body_values

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Errors are raised: the app's exception handlers answer them, as they answer every route's."""
        body = await read_body(scope, receive, self.max_bytes)  # BodySizeLimit has read it: a replay
        if body is None:
            raise ApiError(CLIENT_CLOSED, "the client went away before its request body arrived")
        try:
            request = self.model.model_validate(await parse_body(body, self.max_values))
        except BodyRejected as exc:
            raise ApiError(422, exc.detail, exc.field) from None
        except ValidationError as exc:
            message, field = validation_error(exc.errors(include_url=False))
            raise ApiError(422, message, field) from None
        response = await self.answer(request, self.state, scope["path_params"].get("model"))
        await response(scope, receive, send)


def lane_routes(state: State, routes: list[BaseRoute]) -> list[Route]:
    """A lane route for each FastAPI route whose endpoint has a lane, on its path and with its declaration."""
    lanes = []
    for context in RouteTable.contexts(routes):
        endpoint = getattr(context, "endpoint", None)
        lane: tuple[type[BaseModel], Any] | None = LANES.get(endpoint) if endpoint is not None else None
        if lane is not None:
            route = Route(
                context.path, EmbeddingLane(state, *lane), methods=["POST"], include_in_schema=False
            )
            route.openapi_extra = context.openapi_extra  # type: ignore[attr-defined]
            lanes.append(route)
    return lanes
