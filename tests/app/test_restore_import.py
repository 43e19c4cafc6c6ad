"""A restore imports the archive's rows into a store the service makes; it never adopts the archive's
``store.sqlite``. Each archive whose store was edited with SQL (``harness.archives.hostile_stores``: a CHECK
constraint, a UNIQUE index on chunk text, an index whose WHERE clause raises, a trigger, a row id at the
largest integer; metadata that is a list, a string, 900 levels deep or holds NaN; NaN or infinite vectors)
is refused with 422 naming what is wrong, or restores into a collection that takes writes, reads and every
kind of search. Before, each restored with 200 and the collection then answered 500, or found nothing.

In-process over ASGI with the tiny model: the service's own routes, from upload to search."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx

from app.service.engines import close_engines, load_engines
from app.service.main import create_app
from app.settings import Settings
from harness.archives import hostile_stores
from harness.tiny_model import TINY_WORDS

UPLOAD = {"content-type": "application/octet-stream"}
RANDOM = random.Random(7)
TEXTS = [" ".join(RANDOM.choice(TINY_WORDS) for _ in range(12)) for _ in range(12)]  # the tiny model's words


def serve(settings: Settings, scenario) -> None:
    app = create_app(settings)

    async def main() -> None:
        await load_engines(app.state.engines, app.state.lifecycle, settings, app.state.metrics)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                await scenario(client)
        finally:
            await close_engines(app.state.engines, app.state.lifecycle)

    asyncio.run(main())


async def works(client: httpx.AsyncClient, case: str) -> None:
    """Writes (one of them repeating a stored chunk's text), reads, each search mode with and without a
    filter, and a delete: each answers 200 with what it should hold."""
    fresh = [
        {"id": "fresh", "text": " ".join(TINY_WORDS[:12]), "metadata": {"n": 99}},
        {"id": "twin", "text": TEXTS[0], "metadata": {"n": 100}},
    ]
    put = await client.put("/documents", json=fresh)
    assert put.status_code == 200, (case, put.text)
    for doc_id in ("d0", "fresh"):
        got = await client.get(f"/documents/{doc_id}")
        assert got.status_code == 200 and isinstance(got.json()["metadata"], dict), (case, got.text)
    listed = await client.get("/documents", params={"limit": 100})
    assert listed.status_code == 200 and len(listed.json()["documents"]) == 14, (case, listed.text)
    for mode in ("dense", "bm25", "hybrid"):
        for where in (None, {"n": {"$gte": 0}}):
            body = {"query": TEXTS[1], "mode": mode, "top_k": 3, "filter": where}
            found = await client.post("/search", json=body)
            assert found.status_code == 200, (case, mode, found.text)
            assert found.json()["results"][0]["id"] == "d1", (case, mode, found.json())
    assert (await client.delete("/documents/fresh")).status_code == 200, case


def test_every_hostile_store_is_refused_or_neutralised_and_the_collection_keeps_working(
    tiny_bert: Path, tmp_path: Path
) -> None:
    settings = Settings(
        model=str(tiny_bert), fill_mask_model=str(tiny_bert), backend="torch", index=tmp_path / "index"
    )

    async def scenario(client: httpx.AsyncClient) -> None:
        docs = [{"id": f"d{i}", "text": text, "metadata": {"n": i}} for i, text in enumerate(TEXTS)]
        assert (await client.put("/documents", json=docs)).status_code == 200
        made = await client.post("/collections/default/snapshots")
        assert made.status_code == 201, made.text
        good = (await client.get(f"/collections/default/snapshots/{made.json()['name']}")).content
        outcomes = {}
        for case, (body, words) in hostile_stores(good).items():
            reply = await client.post("/collections/default/restore", content=body, headers=UPLOAD)
            outcomes[case] = reply.status_code
            if words is None:
                assert reply.status_code == 200 and reply.json()["documents"] == 12, (case, reply.text)
            else:
                assert reply.status_code == 422 and reply.json()["field"] == "archive", (case, reply.text)
                assert words in reply.json()["error"] and "store.sqlite" in reply.json()["error"], reply.text
                restored = await client.post("/collections/default/restore", content=good, headers=UPLOAD)
                assert restored.status_code == 200, restored.text  # back to the 12 documents
            await works(client, case)
        assert sorted(set(outcomes.values())) == [200, 422], outcomes

    serve(settings, scenario)
