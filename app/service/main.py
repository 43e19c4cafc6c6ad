"""``create_app``: settings -> a FastAPI app whose models and index load in the background."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from app.service.auth import KeyRing, bearer
from app.service.collections import Collection, CollectionRegistry
from app.service.engines import (
    Engines,
    close_engines,
    follow_published_index,
    load_engines,
    model_registries,
)
from app.service.errors import install_error_handlers
from app.service.jobs import JobRegistry
from app.service.lane import EmbeddingLane
from app.service.metrics import Metrics
from app.service.middleware import AccessGate, BodySizeLimit, BrowserGuard, RequestLog, RequestRecorder
from app.service.model_registry import INDEX_MODEL
from app.service.replication import Replication
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
from index.collections import DEFAULT_COLLECTION

STATIC = Path(__file__).resolve().parents[1] / "static"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(load_engines(app.state.engines, settings, metrics))
        follower = asyncio.create_task(follow_published_index(app.state.engines, settings, metrics))
        replication = asyncio.create_task(app.state.replication.run())
        yield
        follower.cancel()
        replication.cancel()
        loading.cancel()  # a load in a worker thread finishes there; its retries and backoff end here
        await asyncio.gather(loading, follower, replication, return_exceptions=True)
        app.state.jobs.shutdown()
        await close_engines(app.state.engines)

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
        collections=collection_registry(settings),
    )
    app.state.jobs = JobRegistry(keep=settings.max_jobs_kept)
    app.state.engines.bound(settings.max_pending)
    app.state.engines.read_only = settings.serves_read_only  # after Engines(): its __init__ resets it
    app.state.replication = Replication(settings, app.state.engines)
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
    # Outermost first: every request logged and counted; browser guard and keys before a body is read.
    app.add_middleware(
        BodySizeLimit, max_bytes=settings.max_body_bytes, upload_bytes=settings.max_snapshot_upload_bytes
    )
    app.add_middleware(AccessGate, keys=app.state.keys, open_operations=settings.open_operations)
    app.add_middleware(BrowserGuard, settings=settings)
    app.add_middleware(RequestLog, recorder=app.state.recorder)
    return app


def collection_registry(settings: Settings) -> CollectionRegistry:
    """The collections the settings place: ``default`` at ``CLOZE_INDEX``, the others under the data root."""
    default = Collection(
        DEFAULT_COLLECTION, INDEX_MODEL, Path(settings.index), read_only=settings.serves_read_only
    )
    return CollectionRegistry(settings.collections_root, default, settings.max_collections)


def create_service(settings: Settings | None = None) -> EmbeddingLane:
    """What ``cloze serve`` runs: the app behind the lane that answers the two hot embedding routes."""
    return EmbeddingLane(create_app(settings))


def _add_pages(app: FastAPI) -> None:
    """The playground: files from the app's own static folder only (StaticFiles refuses paths outside it)."""
    app.mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        page = STATIC / "index.html"
        return FileResponse(page) if page.is_file() else RedirectResponse("/docs")
