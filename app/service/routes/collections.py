"""Collections: create, list, show and delete them; ``current_collection`` hands the others' routes theirs.

Search, documents, rebuilds, jobs and snapshots of a collection live under ``/collections/{name}/...``; the
same routes without the prefix are the collection ``default`` (the service's index, ``CLOZE_INDEX``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from app.service.collection_schemas import CollectionCreate, CollectionDeleted, CollectionList, CollectionOut
from app.service.collections import Collection
from app.service.errors import ApiError, without_server_paths
from app.service.route_table import declare
from app.service.validation import StrictJSONRoute
from index.collections import DEFAULT_COLLECTION, CollectionInfo, disk_usage, last_write
from index.records import ReadOnlyIndex, collection_name_problem

router = APIRouter(route_class=StrictJSONRoute)
CollectionName = Annotated[str, Path(min_length=1, max_length=256, description="a collection's name")]


async def collection_in_path(collection: CollectionName) -> None:
    """Declares ``{collection}`` of the ``/collections/{collection}/...`` routes (OpenAPI); ``current_collection``
    reads it."""


async def current_collection(request: Request) -> AsyncIterator[Collection]:
    """The collection the route's declaration names (``default`` without the prefix), counted in flight while
    the request runs: a delete waits for it, and requests that arrive after the delete began get 404."""
    name = request.app.state.routes.resolve(request.scope).collection
    async with request.app.state.engines.collections.using(name) as collection:
        yield collection


@router.get(
    "/collections", openapi_extra=declare("read"), response_model=CollectionList, tags=["collections"]
)
async def list_collections(request: Request) -> CollectionList:
    """Every collection this key may read, ``default`` first."""
    engines, grant = request.app.state.engines, getattr(request.state, "grant", None)
    registry = engines.collections
    visible = [c for c in registry.collections.values() if grant is None or grant.may_read(c.name)]
    with contextlib.ExitStack() as stack:  # each held while described: a delete waits for it
        held = [c for c in visible if stack.enter_context(registry.held(c))]
        described = await engines.work_pool.run(lambda: [describe(c) for c in held])
    return CollectionList(collections=described)


@router.get(
    "/collections/{name}",
    openapi_extra=declare("read", "name"),
    response_model=CollectionOut,
    tags=["collections"],
)
async def show_collection(name: CollectionName, request: Request) -> CollectionOut:
    """Its model, documents, chunks, version, build options, bytes on disk and last write."""
    engines = request.app.state.engines
    async with engines.collections.using(name) as collection:
        return await engines.work_pool.run(describe, collection, True)


@router.post(
    "/collections",
    openapi_extra=declare("admin"),
    status_code=201,
    response_model=CollectionOut,
    tags=["collections"],
)
async def create(body: CollectionCreate, request: Request) -> CollectionOut:
    """A new, empty collection on a served embedding model, or (`dimension`) of vectors you supply; 409 when
    the name is taken or the limit (`CLOZE_MAX_COLLECTIONS`) is reached."""
    settings, engines = request.app.state.settings, request.app.state.engines
    if problem := collection_name_problem(body.name):
        raise ApiError(422, f"name: {body.name!r} is not a collection name: {problem}", "name")
    refuse_on_a_copy(settings, "create")
    request.app.state.replication.refuse_unless_writing(body.name)
    info, encoder = _new_collection(body, engines)
    async with request.app.state.lifecycle.created(info, encoder) as collection:
        return await engines.work_pool.run(describe, collection)


@router.delete(
    "/collections/{name}",
    openapi_extra=declare("admin", "name"),
    response_model=CollectionDeleted,
    tags=["collections"],
)
async def delete(name: CollectionName, request: Request) -> CollectionDeleted:
    """Requests already running on it finish first (409 if they outlive the wait, the collection still
    served); new ones get 404 from the moment this begins. Its snapshots are moved aside, not listed again."""
    settings, jobs = request.app.state.settings, request.app.state.jobs
    if name == DEFAULT_COLLECTION:
        raise ApiError(
            409,
            "name: the collection 'default' is the service's index (CLOZE_INDEX) and is not deleted; "
            "delete its documents, or restore a snapshot",
            "name",
        )
    refuse_on_a_copy(settings, "delete")
    request.app.state.replication.refuse_unless_writing(name)

    def busy(name: str) -> str | None:
        running = jobs.running(name)
        return f"a rebuild of {name!r} is running (job {running.job_id})" if running else None

    await request.app.state.lifecycle.delete(name, busy)
    return CollectionDeleted(deleted=name)


def writable(request: Request, collection: Collection) -> Any:
    """The collection's index for a write other than of documents (those ask ``admit``): 409 on a read-only
    service or a replica, 503 on a writer that was fenced or has not yet read the bucket."""
    index = collection.writable_index()
    request.app.state.replication.refuse_unless_writing(collection.name)
    return index


def refuse_on_a_copy(settings: Any, verb: str) -> None:
    """409 on a read-only service and on a replica: collections are made and removed on the writer (a
    replica mirrors the writer's list)."""
    if settings.index_read_only:
        raise ReadOnlyIndex(f"this service is read-only: {verb} collections on the writer")
    if settings.replication_role == "replica":
        raise ReadOnlyIndex(
            f"this service is a replica (CLOZE_REPLICATION_ROLE=replica): {verb} collections on the writer, "
            "and the replicas follow"
        )


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


def describe(collection: Collection, detailed: bool = False) -> CollectionOut:
    """What ``GET /collections`` lists (counts, version, build options) and, ``detailed``, what
    ``GET /collections/{name}`` adds (bytes on disk, last write): reads files, so in a worker thread."""
    answer: dict[str, Any] = {
        "name": collection.name,
        "model": collection.model,
        "dimension": collection.info.dimension,
        "metric": collection.info.metric,
        "status": collection.status,
        "error": without_server_paths(collection.error) if collection.error else None,
        "created": collection.info.created,
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
