"""``create_app``: settings -> a FastAPI app whose models and index load in the background."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
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
from app.service.middleware import (
    AccessGate,
    BodySizeLimit,
    BrowserGuard,
    CloseAfterUnreadBody,
    RequestLog,
    RequestRecorder,
)
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
from app.service.tracing import configure_tracing
from app.settings import Settings, get_settings

log = logging.getLogger("cloze.service")
STATIC = Path(__file__).resolve().parents[1] / "static"
READY_POLL_S = 0.2  # how often the start-up checks whether /readyz would answer 200 yet
OAUTH_REDIRECT = "/docs/oauth2-redirect"  # FastAPI's default swagger_ui_oauth2_redirect_url
DOCS_ASSETS = "/docs/assets"  # Swagger UI's and ReDoc's scripts and styles, from the fastapi-offline package
PAGE_METHODS = ["GET", "HEAD"]  # as FastAPI's own docs pages took (a link checker asks HEAD)


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
        docs_url=None,  # FastAPI's pages load their scripts from a CDN: _add_docs serves them from here
        redoc_url=None,
        # Export is set up by ``configure_tracing`` (traces only, this service's name); FastAPI's own set-up
        # (FASTAPI_OTEL_AUTO_CONFIGURE) would add a second exporter to that provider, and metrics and logs.
        telemetry={"auto_configure": False},
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
    _add_docs(app)
    for route in app.routes:  # FastAPI's own page: the schema
        if getattr(route, "path", None) == app.openapi_url:
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
    app.add_middleware(CloseAfterUnreadBody)
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
    """What ``cloze serve`` runs (in each worker process: the tracer provider is per process)."""
    configure_tracing()
    return create_app(settings)


def _add_pages(app: FastAPI) -> None:
    """The playground: files from the app's own static folder only (StaticFiles refuses paths outside it)."""
    static = Mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")
    app.router.routes.append(declare_route(static, "public"))

    @app.get("/", include_in_schema=False, openapi_extra=declare("public"))
    async def home() -> Response:
        page = STATIC / "index.html"
        return FileResponse(page) if page.is_file() else RedirectResponse("/docs")


def _add_docs(app: FastAPI) -> None:
    """Swagger UI at /docs and ReDoc at /redoc, their scripts served by this service: FastAPI's own pages load
    them from a CDN, so a service without internet (or a browser behind a strict proxy) showed a blank page."""
    assets = Path(str(importlib.resources.files("fastapi_offline") / "static"))
    mount = Mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")
    app.router.routes.append(declare_route(mount, "public"))

    @app.api_route("/docs", methods=PAGE_METHODS, include_in_schema=False, openapi_extra=declare("public"))
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")  # behind a proxy's prefix, the page's links keep it
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{OAUTH_REDIRECT}",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.api_route(
        OAUTH_REDIRECT, methods=PAGE_METHODS, include_in_schema=False, openapi_extra=declare("public")
    )
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.api_route("/redoc", methods=PAGE_METHODS, include_in_schema=False, openapi_extra=declare("public"))
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,  # fonts.googleapis.com: the system's fonts instead
        )
        # ReDoc's menu always asks its vendor's CDN for a logo (hidden when that fails): images from here only,
        # so the page asks nothing of the internet and tells no one it was opened.
        page.headers["Content-Security-Policy"] = "img-src 'self' data:"
        return page
