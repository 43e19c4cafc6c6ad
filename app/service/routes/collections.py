"""Collections: create, list, show and delete them; ``current_collection`` hands the others' routes theirs.

Search, documents, rebuilds, jobs and snapshots of a collection live under ``/collections/{name}/...``; the
same routes without the prefix are the collection ``default`` (the service's index, ``CLOZE_INDEX``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool

from app.service.collections import Collection
from app.service.engines import close_collection, open_collection
from app.service.errors import ApiError
from app.service.schemas import CollectionCreate, CollectionDeleted, CollectionList, CollectionOut
from app.service.validation import StrictJSONRoute
from index.collections import (
    DEFAULT_COLLECTION,
    CollectionError,
    CollectionInfo,
    create_collection,
    delete_collection,
    disk_usage,
    last_write,
)
from index.own_vectors import OwnVectors
from index.records import ReadOnlyIndex, collection_name_problem

router = APIRouter(route_class=StrictJSONRoute)
CollectionName = Annotated[str, Path(min_length=1, max_length=256, description="a collection's name")]


async def collection_in_path(collection: CollectionName) -> None:
    """Declares ``{collection}`` of the ``/collections/{collection}/...`` routes (OpenAPI); ``current_collection``
    reads it."""


async def current_collection(request: Request) -> AsyncIterator[Collection]:
    """The collection the path names (``default`` without the prefix), counted in flight while the request
    runs: a delete waits for it, and requests that arrive after the delete began get 404."""
    name = request.path_params.get("collection", DEFAULT_COLLECTION)
    async with request.app.state.engines.collections.using(name) as collection:
        yield collection


def own_vectors(collection: Collection) -> OwnVectors | None:
    """The shape of a collection of the caller's own vectors; None for a collection a model embeds."""
    return collection.info.own_vectors() if collection.info is not None else None


@router.get("/collections", response_model=CollectionList, tags=["collections"])
async def list_collections(request: Request) -> CollectionList:
    """Every collection this key may read, ``default`` first."""
    engines, grant = request.app.state.engines, getattr(request.state, "grant", None)
    visible = [c for c in engines.collections.collections.values() if grant is None or grant.may_read(c.name)]
    described = await engines.work_pool.run(lambda: [describe(c) for c in visible])
    return CollectionList(collections=described)


@router.get("/collections/{name}", response_model=CollectionOut, tags=["collections"])
async def show_collection(name: CollectionName, request: Request) -> CollectionOut:
    """Its model, documents, chunks, version, build options, bytes on disk and last write."""
    engines = request.app.state.engines
    async with engines.collections.using(name) as collection:
        return await engines.work_pool.run(describe, collection, True)


@router.post("/collections", status_code=201, response_model=CollectionOut, tags=["collections"])
async def create(body: CollectionCreate, request: Request) -> CollectionOut:
    """A new, empty collection on a served embedding model, or (`dimension`) of vectors you supply; 409 when
    the name is taken or the limit (`CLOZE_MAX_COLLECTIONS`) is reached."""
    settings, engines = request.app.state.settings, request.app.state.engines
    if problem := collection_name_problem(body.name):
        raise ApiError(422, f"name: {body.name!r} is not a collection name: {problem}", "name")
    if engines.read_only:
        raise ReadOnlyIndex("this service is read-only: create collections on the writer")
    info, encoder = _new_collection(body, engines)
    registry = engines.collections
    async with registry.lifecycle:
        if body.name in registry.collections:
            raise ApiError(409, f"name: a collection named {body.name!r} exists", "name")
        if len(registry.others()) >= settings.max_collections:
            raise ApiError(
                409,
                f"this service holds {settings.max_collections} collections, its limit "
                "(CLOZE_MAX_COLLECTIONS): delete one first",
                "name",
            )
        try:
            path = await run_in_threadpool(create_collection, registry.root, info, encoder)
        except CollectionError as exc:
            raise ApiError(exc.status, str(exc), exc.field) from exc
        collection = Collection(body.name, info.model, path, info)
        registry.collections[body.name] = collection
        await open_collection(engines, collection, settings, request.app.state.metrics)
    return await engines.work_pool.run(describe, collection)


@router.delete("/collections/{name}", response_model=CollectionDeleted, tags=["collections"])
async def delete(name: CollectionName, request: Request) -> CollectionDeleted:
    """Requests already running on it finish; new ones get 404 from the moment this begins."""
    engines, jobs = request.app.state.engines, request.app.state.jobs
    if name == DEFAULT_COLLECTION:
        raise ApiError(
            409,
            "name: the collection 'default' is the service's index (CLOZE_INDEX) and is not deleted; "
            "delete its documents, or restore a snapshot",
            "name",
        )
    if engines.read_only:
        raise ReadOnlyIndex("this service is read-only: delete collections on the writer")
    registry = engines.collections
    async with registry.lifecycle:
        collection = registry.get(name, "name")
        if running := jobs.running(name):
            raise ApiError(409, f"name: a rebuild of {name!r} is running (job {running.job_id})", "name")
        registry.withdraw(name)
        await registry.drained(collection)
        await run_in_threadpool(close_collection, collection)
        try:
            await run_in_threadpool(delete_collection, registry.root, name)
        except CollectionError as exc:
            raise ApiError(exc.status, str(exc), exc.field) from exc
    return CollectionDeleted(deleted=name)


def _new_collection(body: CollectionCreate, engines: Any) -> tuple[CollectionInfo, Any]:
    """The collection a create asks for, and its encoder: a served model's, or (``dimension``) what stands for
    one in a collection of the caller's own vectors, which keeps each document whole (one vector each)."""
    if body.dimension is None:
        if body.metric is not None:
            raise ApiError(
                422, "metric: applies to a collection of your own vectors (give `dimension`)", "metric"
            )
        slot = engines.models.find(body.model)
        encoder, _ = engines.models.loaded(slot)
        _check_chunking(body, encoder.max_tokens)
        return CollectionInfo(
            body.name, slot.name, body.factory, body.chunk_window, body.chunk_overlap
        ), encoder
    if "model" in body.model_fields_set:
        raise ApiError(
            422, "model: a collection has a model or a `dimension` (your own vectors), not both", "model"
        )
    for name in ("chunk_window", "chunk_overlap"):
        if getattr(body, name) is not None:
            raise ApiError(
                422, f"{name}: a collection of your own vectors holds one chunk per document", name
            )
    info = CollectionInfo(
        body.name, None, body.factory, dimension=body.dimension, metric=body.metric or "cosine"
    )
    return info, info.own_vectors()


def _check_chunking(body: CollectionCreate, max_tokens: int) -> None:
    if body.chunk_window is not None and body.chunk_window > max_tokens:
        raise ApiError(
            422, f"chunk_window: {body.chunk_window}, over the model's {max_tokens} tokens", "chunk_window"
        )
    window = body.chunk_window or max_tokens
    if body.chunk_overlap is not None and body.chunk_overlap >= window:
        raise ApiError(
            422, f"chunk_overlap: {body.chunk_overlap}, not below the window of {window}", "chunk_overlap"
        )


def describe(collection: Collection, detailed: bool = False) -> CollectionOut:
    """What ``GET /collections`` lists (counts, version, build options) and, ``detailed``, what
    ``GET /collections/{name}`` adds (bytes on disk, last write): reads files, so in a worker thread."""
    answer: dict[str, Any] = {
        "name": collection.name,
        "model": collection.model,
        "dimension": collection.info.dimension if collection.info else None,
        "metric": collection.info.metric if collection.info else None,
        "status": collection.status,
        "error": collection.error,
        "created": collection.info.created if collection.info else None,
    }
    if collection.index is not None:
        manifest = collection.index.manifest
        build = manifest.get("build", {})
        answer |= {
            "documents": manifest.get("documents"),
            "chunks": manifest.get("chunks"),
            "version": manifest.get("version"),
            "factory": build.get("factory"),
            "chunk_window": build.get("chunk_window"),
            "chunk_overlap": build.get("chunk_overlap"),
        }
    if detailed:
        answer |= {"bytes_on_disk": disk_usage(collection.path), "last_write": last_write(collection.path)}
    return CollectionOut(**answer)
