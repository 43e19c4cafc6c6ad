"""Snapshots of a collection: make one, list, download, delete, and restore one (stored, or uploaded).

The mechanics are ``index.archive.snapshots``, functions over an index folder and a snapshot folder. Snapshots and
restores of a collection run one at a time (409 for another), each in a thread of its own: minutes of copying
must not hold a write slot.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from app.service.collection_schemas import RestoreResult, SnapshotDeleted, SnapshotInfo, SnapshotList
from app.service.collections import Collection, snapshot_folder_of
from app.service.errors import ApiError
from app.service.route_table import declare
from app.service.routes.collections import current_collection, writable
from app.service.validation import StrictJSONRoute
from index.archive import snapshots

router = APIRouter(route_class=StrictJSONRoute)
InCollection = Annotated[Collection, Depends(current_collection)]
SnapshotName = Annotated[str, PathParam(min_length=1, max_length=160)]
UPLOAD_FLUSH_BYTES = 4 << 20  # uploaded bytes gathered before one write to disk (off the event loop)


def snapshot_folder(request: Request, collection: Collection) -> Path:
    return snapshot_folder_of(request.app.state.settings.snapshots_dir, collection.name, collection.path)


@router.post(
    "/collections/{collection}/snapshots",
    openapi_extra=declare("write", "collection"),
    status_code=201,
    response_model=SnapshotInfo,
    tags=["snapshots"],
)
async def create_snapshot(request: Request, collection: InCollection) -> SnapshotInfo:
    """A snapshot of the published version, while searches and writes go on: every write acknowledged
    before this request, none made after it began. 409 while another runs, 507 when it cannot fit."""
    folder = snapshot_folder(request, collection)
    settings, index = request.app.state.settings, collection.require_index()
    entry = await run_in_threadpool(
        index.snapshot, folder, settings.snapshot_compression, settings.snapshot_keep
    )
    return SnapshotInfo(**entry)


@router.get(
    "/collections/{collection}/snapshots",
    openapi_extra=declare("read", "collection"),
    response_model=SnapshotList,
    tags=["snapshots"],
)
async def list_snapshots(request: Request, collection: InCollection) -> SnapshotList:
    folder = snapshot_folder(request, collection)
    entries = await run_in_threadpool(snapshots.list_snapshots, folder)
    return SnapshotList(collection=collection.name, snapshots=[SnapshotInfo(**entry) for entry in entries])


@router.get(
    "/collections/{collection}/snapshots/{snapshot}",
    openapi_extra=declare("read", "collection"),
    response_class=FileResponse,
    tags=["snapshots"],
    responses={200: {"content": {"application/x-tar": {}}, "description": "the archive"}},
)
async def download_snapshot(
    snapshot: SnapshotName, request: Request, collection: InCollection
) -> FileResponse:
    path = snapshots.path_of(snapshot_folder(request, collection), snapshot)
    media = "application/gzip" if path.name.endswith(".gz") else "application/x-tar"
    return FileResponse(path, media_type=media, filename=path.name)


@router.delete(
    "/collections/{collection}/snapshots/{snapshot}",
    openapi_extra=declare("write", "collection"),
    response_model=SnapshotDeleted,
    tags=["snapshots"],
)
async def delete_snapshot(
    snapshot: SnapshotName, request: Request, collection: InCollection
) -> SnapshotDeleted:
    await run_in_threadpool(snapshots.delete_snapshot, snapshot_folder(request, collection), snapshot)
    return SnapshotDeleted(deleted=snapshot)


@router.post(
    "/collections/{collection}/snapshots/{snapshot}/restore",
    openapi_extra=declare("write", "collection"),
    response_model=RestoreResult,
    tags=["snapshots"],
)
async def restore_snapshot(
    snapshot: SnapshotName, request: Request, collection: InCollection
) -> RestoreResult:
    """Replace the collection with a stored snapshot (a rollback): verified before anything is written,
    published atomically; 422 naming what is wrong with a damaged or foreign archive."""
    folder = snapshot_folder(request, collection)
    index = writable(request, collection)
    path = snapshots.path_of(folder, snapshot)
    with snapshots.exclusive(folder):
        result = await run_in_threadpool(index.restore, path)
    return RestoreResult(**result)


@router.post(
    "/collections/{collection}/restore",
    response_model=RestoreResult,
    tags=["snapshots"],
    openapi_extra={
        **declare("write", "collection", streamed_body=True),
        "requestBody": {
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        },
    },
)
async def restore_upload(request: Request, collection: InCollection) -> RestoreResult:
    """Replace the collection with an uploaded archive (the body, as `application/octet-stream`): streamed to
    disk up to `CLOZE_MAX_SNAPSHOT_UPLOAD_BYTES` (413 above), then restored as a stored snapshot is."""
    folder = snapshot_folder(request, collection)
    index = writable(request, collection)
    with snapshots.exclusive(folder):
        upload = folder / f".upload-{secrets.token_hex(6)}{snapshots.PARTIAL}"
        try:
            await receive_upload(request, upload, request.app.state.settings.max_snapshot_upload_bytes)
            result = await run_in_threadpool(index.restore, upload)
        finally:
            upload.unlink(missing_ok=True)
    return RestoreResult(**result)


async def receive_upload(request: Request, target: Path, limit: int) -> None:
    """The request body into ``target``, refused with 413 as soon as it passes ``limit`` bytes (a declared
    length past it is refused before a byte is read: ``BodySizeLimit``)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit():
        try:
            await run_in_threadpool(snapshots.check_space, target.parent, 2 * int(declared))
        except (
            snapshots.SnapshotNoSpace
        ) as exc:  # the archive is too large for this disk: the client's to fix
            raise ApiError(413, f"archive: too large for the free space: {exc}", "archive") from exc
    size, pending = 0, bytearray()
    with target.open("wb") as handle:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(
                    413, f"archive over the {limit}-byte limit (CLOZE_MAX_SNAPSHOT_UPLOAD_BYTES)", "body"
                )
            pending += chunk
            if len(pending) >= UPLOAD_FLUSH_BYTES:
                await run_in_threadpool(handle.write, bytes(pending))
                pending.clear()
        await run_in_threadpool(handle.write, bytes(pending))
    if size == 0:
        raise ApiError(422, "archive: the body is empty: send the snapshot archive as the body", "archive")
