"""Index jobs: a background rebuild (re-embed every document into a new version) and its status."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from app.service.collections import Collection
from app.service.errors import ApiError
from app.service.route_table import declare
from app.service.routes.collections import current_collection, writable
from app.service.schemas import JobAccepted, JobStatus
from app.service.validation import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute)


@router.post(
    "/index/rebuild",
    openapi_extra=declare("write", "collection"),
    status_code=202,
    response_model=JobAccepted,
    tags=["index"],
)
async def rebuild_index(
    request: Request, collection: Annotated[Collection, Depends(current_collection)]
) -> JobAccepted:
    """Re-embed every document into a new index version; searches use the old one until it is published."""
    index = writable(request, collection)  # at once, not a 202 for a job that must fail
    if collection.info.own_vectors() is not None:
        raise ApiError(
            409,
            f"{collection.name!r} holds vectors its callers supply: there is no model to re-embed with",
            None,
        )
    jobs = request.app.state.jobs
    if running := jobs.running(collection.name):
        raise ApiError(409, f"a rebuild is already running: job {running.job_id}", None)
    job = jobs.submit("rebuild", lambda progress: index.rebuild(progress), collection.name)
    return JobAccepted(job_id=job.job_id)


@router.get(
    "/jobs/{job_id}", openapi_extra=declare("read", "collection"), response_model=JobStatus, tags=["index"]
)
async def job_status(
    job_id: Annotated[str, Path(max_length=64)],
    request: Request,
    collection: Annotated[Collection, Depends(current_collection)],
) -> JobStatus:
    job = request.app.state.jobs.get(job_id)
    if job is None or job.collection != collection.name:
        raise ApiError(404, f"no job {job_id!r} in the collection {collection.name!r}", "job_id")
    return JobStatus.model_validate(job, from_attributes=True)
