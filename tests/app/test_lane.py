"""The embedding lane answers exactly as the FastAPI routes whose paths it takes (same status, headers that
matter, body), for answers and for every kind of refusal, and every middleware sees its requests. In-process
over ASGI, on the tiny random model."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.service.main import create_app
from app.settings import Settings
from encoder_runtime import MicroBatcher, load_encoder

READ = {"Authorization": "Bearer read-key"}
CASES = [
    ("/embed", {"inputs": ["the cat sat", "a dog"]}, READ),
    ("/embed", {"inputs": "the cat", "normalize": False, "dimensions": 8}, READ),
    ("/embed", {"inputs": ["word " * 80]}, READ),  # over the 64-token window: refused without truncate
    ("/embed", {"inputs": ["word " * 80], "truncate": True}, READ),
    ("/embed", {"inputs": []}, READ),
    ("/embed", {"inputs": ["x"] * 9}, READ),  # over max_inputs
    ("/embed", {"inputs": "a", "colour": 1}, READ),
    ("/embed", {"inputs": "a", "prompt_name": "query"}, READ),
    ("/embed", {"inputs": "a"}, {}),
    ("/embed", {"inputs": "a"}, {"Authorization": "Bearer wrong"}),
    ("/v1/embeddings", {"input": ["the cat", "word " * 80], "encoding_format": "base64"}, READ),
    ("/v1/embeddings", {"input": "the cat", "encoding_format": "float", "dimensions": 4}, READ),
    ("/v1/embeddings", {"input": "the cat", "dimensions": 10_000}, READ),
    ("/v1/embeddings", {"input": 5}, READ),
]


def keyed_app(settings: Settings, encoder, lane: bool):
    service = create_app(settings, lane=lane)
    service.state.engines.models.default.runtime = encoder
    return service


@pytest.fixture(scope="module")
def apps(tiny_bert, tmp_path_factory):
    """The same service with the lane (as ``cloze serve`` runs it) and without (FastAPI's routes answer)."""
    settings = Settings(
        api_keys=["write-key"], read_api_keys=["read-key"], max_inputs=8, index=tmp_path_factory.mktemp("i")
    )
    encoder = load_encoder(str(tiny_bert), backend="torch")
    return keyed_app(settings, encoder, lane=True), keyed_app(settings, encoder, lane=False)


def run(apps, scenario):
    """``scenario`` on a fresh event loop, with batchers of its own (a batcher answers on the loop it began on)."""

    async def main():
        batchers = []
        for app in apps:
            slot = app.state.engines.models.default
            slot.batcher = MicroBatcher.for_runtime(slot.runtime)
            batchers.append(slot.batcher)
        try:
            return await scenario()
        finally:
            for batcher in batchers:
                await batcher.stop()

    return asyncio.run(main())


async def answers(asgi, cases) -> list[tuple[int, str | None, bytes]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://test") as client:
        out = []
        for route, body, headers in cases:
            reply = await client.post(route, json=body, headers=headers)
            out.append((reply.status_code, reply.headers.get("x-truncated-inputs"), reply.content))
        return out


def test_the_lane_answers_as_the_routes_do(apps):
    with_lane, without = apps
    assert with_lane.state.routes.resolve_path("POST", "/embed") is not None
    via_lane, via_fastapi = run(
        apps, lambda: asyncio.gather(answers(with_lane, CASES), answers(without, CASES))
    )
    statuses = [status for status, _, _ in via_fastapi]
    assert statuses == [200, 200, 422, 200, 422, 422, 422, 422, 401, 401, 200, 200, 422, 422]
    assert via_lane == via_fastapi


def test_the_lane_passes_the_middleware_and_is_counted_by_its_template(apps):
    started = apps[0]
    with_lane = keyed_app(started.state.settings, started.state.engines.models.default.runtime, lane=True)

    @with_lane.middleware("http")  # added after create_app: the lane's requests pass it too
    async def mark(request, call_next):
        response = await call_next(request)
        response.headers["x-seen-by"] = "late-middleware"
        return response

    async def scenario():
        transport = httpx.ASGITransport(app=with_lane)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            big = await client.post(
                "/embed", content=b'{"inputs": "' + b"z" * 5_000_000 + b'"}', headers=READ
            )
            given = await client.post("/embed", json={"inputs": "a"}, headers={**READ, "X-Request-ID": "abc"})
            made = await client.post("/models/default/embed", json={"inputs": "a"}, headers=READ)
            metrics = (await client.get("/metrics", headers=READ)).text
        return big, given, made, metrics

    big, given, made, metrics = run([with_lane], scenario)
    assert big.status_code == 413 and big.json()["field"] == "body"
    assert given.headers["x-request-id"] == "abc" and made.headers["x-request-id"]
    assert given.headers["x-seen-by"] == made.headers["x-seen-by"] == "late-middleware"
    assert 'cloze_requests_total{method="POST",route="/embed",status="200"}' in metrics
    assert 'route="/models/{model}/embed",status="200"' in metrics
