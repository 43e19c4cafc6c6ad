"""``create_app``: settings -> a FastAPI app whose models and index load in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.routing import Mount

from app.service.auth import KeyRing, bearer
from app.service.collections import CollectionRegistry
from app.service.engines import Engines, close_engines, load_engines, model_registries
from app.service.errors import install_error_handlers
from app.service.jobs import JobRegistry
from app.service.lane import lane_routes
from app.service.lifecycle import Lifecycle
from app.service.metrics import Metrics
from app.service.middleware import AccessGate, BodySizeLimit, BrowserGuard, RequestLog, RequestRecorder
from app.service.replication import replication_for
from app.service.route_table import RouteTable, declare, declare_route
from app.service.routes import (
    collections,
    documents,
    inference,
    jobs,
    meta,
    playground,
    rerank,
    search,
    snapshots,
)
from app.settings import Settings, get_settings

log = logging.getLogger("cloze.service")
STATIC = Path(__file__).resolve().parents[1] / "static"
READY_POLL_S = 0.2  # how often the start-up checks whether /readyz would answer 200 yet
OAUTH_REDIRECT = "/docs/oauth2-redirect"  # FastAPI's default swagger_ui_oauth2_redirect_url


def create_app(settings: Settings | None = None, lane: bool = True) -> FastAPI:
    """``lane``: answer the hot embedding routes through ``EmbeddingLane`` (False: FastAPI's routes answer
    them, as the lane's tests compare)."""
    settings = settings or get_settings()
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engines, lifecycle = app.state.engines, app.state.lifecycle
        loading = asyncio.create_task(load_engines(engines, lifecycle, settings, metrics))
        follower = asyncio.create_task(lifecycle.follow())
        replication = asyncio.create_task(app.state.replication.run())
        announcer = asyncio.create_task(announce_ready(app.state, time.monotonic()))
        yield
        follower.cancel()
        replication.cancel()
        announcer.cancel()
        loading.cancel()  # a load in a worker thread finishes there; its retries and backoff end here
        await asyncio.gather(loading, follower, replication, announcer, return_exceptions=True)
        app.state.jobs.shutdown()
        await close_engines(engines, lifecycle)

    app = FastAPI(
        title="cloze-search",
        dependencies=[Depends(bearer)],  # the key scheme in OpenAPI; AccessGate decides
        version="0.1.0",
        description="Semantic search, embeddings and fill-mask over encoders you train yourself.",
        lifespan=lifespan,
    )
    app.state.settings, app.state.metrics = settings, metrics
    app.state.recorder = RequestRecorder(metrics)
    app.state.keys = KeyRing(settings.api_keys, settings.read_api_keys, settings.scoped_keys())
    embedding_models, fill_mask_models, rerankers = model_registries(settings)
    app.state.engines = Engines(
        models=embedding_models,
        fill_masks=fill_mask_models,
        rerankers=rerankers,
        collections=CollectionRegistry(
            settings.collections_root, settings.max_collections, settings.delete_wait_s
        ),
    )
    app.state.lifecycle = Lifecycle(app.state.engines.collections, embedding_models, settings, metrics)
    app.state.jobs = JobRegistry(keep=settings.max_jobs_kept)
    app.state.engines.bound(settings.max_pending)
    app.state.replication = replication_for(settings, app.state.engines, app.state.lifecycle)
    install_error_handlers(app)
    for module in (inference, rerank, meta, playground, collections):
        app.include_router(module.router)
    app.include_router(snapshots.router, dependencies=[Depends(collections.collection_in_path)])
    for module in (search, documents, jobs):  # a collection's routes; without the prefix, default's
        app.include_router(module.router)
        app.include_router(
            module.router,
            prefix="/collections/{collection}",
            dependencies=[Depends(collections.collection_in_path)],
        )
    _add_pages(app)
    for route in app.routes:  # FastAPI's own pages: the schema and the docs
        if getattr(route, "path", None) in (app.openapi_url, app.docs_url, app.redoc_url, OAUTH_REDIRECT):
            declare_route(route, "public")
    if lane:
        app.router.routes[:0] = lane_routes(app.state, app.routes)
    app.state.routes = routes = RouteTable(app.routes)
    # Outermost first: every request, the lane's included, logged and counted; browser guard and keys before
    # a body is read.
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        routes=routes,
        upload_bytes=settings.max_snapshot_upload_bytes,
    )
    app.add_middleware(
        AccessGate, keys=app.state.keys, open_operations=settings.open_operations, routes=routes
    )
    app.add_middleware(BrowserGuard, settings=settings)
    app.add_middleware(RequestLog, recorder=app.state.recorder, routes=routes)
    return app


async def announce_ready(state: Any, since: float) -> None:
    """One log line when /readyz first would answer 200. Uvicorn's "running" line comes seconds earlier (the
    models load and the collections open after it), and a request sent on seeing it answers 503: this is the
    line to wait for. It names every collection, each tried by then, and says which did not open."""
    engines, replication = state.engines, state.replication
    while not (engines.ready and replication.ready(await run_in_threadpool(replication.status))):
        if engines.load_failed:  # the model failed every attempt: logged as that, never ready
            return
        await asyncio.sleep(READY_POLL_S)
    collections = list(engines.collections.collections.values())
    opened = [c.name for c in collections if c.status == "ready"]
    failed = [f"{c.name} ({c.status}: {c.error})" for c in collections if c.status != "ready"]
    log.info(
        "ready: %d collection(s) open (%s)%s, %.1f s after start-up",
        len(opened),
        ", ".join(opened),
        f"; not open: {'; '.join(failed)}" if failed else "",
        time.monotonic() - since,
    )


def create_service(settings: Settings | None = None) -> FastAPI:
    """What ``cloze serve`` runs."""
    return create_app(settings)


def _add_pages(app: FastAPI) -> None:
    """The playground: files from the app's own static folder only (StaticFiles refuses paths outside it)."""
    static = Mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")
    app.router.routes.append(declare_route(static, "public"))

    @app.get("/", include_in_schema=False, openapi_extra=declare("public"))
    async def home() -> Response:
        page = STATIC / "index.html"
        return FileResponse(page) if page.is_file() else RedirectResponse("/docs")
