"""Index jobs: a background rebuild (re-embed every document into a new version) and its status."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from app.service.errors import ApiError
from app.service.schemas import JobAccepted, JobStatus
from app.service.validation import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute)


@router.post(
    "/index/rebuild",
    status_code=202,
    response_model=JobAccepted,
    tags=["index"],
)
async def rebuild_index(request: Request) -> JobAccepted:
    """Re-embed every document into a new index version; searches use the old one until it is published."""
    index = request.app.state.engines.writable_index()  # at once, not a 202 for a job that must fail
    jobs = request.app.state.jobs
    running = [
        job for job in jobs.jobs.values() if job.kind == "rebuild" and job.status in ("queued", "running")
    ]
    if running:
        raise ApiError(409, f"a rebuild is already running: job {running[0].job_id}", None)
    job = jobs.submit("rebuild", lambda progress: index.rebuild(progress))
    return JobAccepted(job_id=job.job_id)


@router.get("/jobs/{job_id}", response_model=JobStatus, tags=["index"])
async def job_status(job_id: Annotated[str, Path(max_length=64)], request: Request) -> JobStatus:
    job = request.app.state.jobs.get(job_id)
    if job is None:
        raise ApiError(404, f"no job {job_id!r}", "job_id")
    return JobStatus.model_validate(job, from_attributes=True)
