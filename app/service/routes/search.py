"""Search (dense / BM25 / hybrid), documents, and index rebuild jobs."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request

from app.service.engines import submit
from app.service.errors import ApiError
from app.service.schemas import (
    DeleteResponse,
    DocumentIn,
    DocumentOut,
    JobAccepted,
    JobStatus,
    SearchMode,
    SearchRequest,
    SearchResponse,
    SearchResult,
    UpsertResponse,
)
from app.service.validation import StrictJSONRoute, check_filter, check_metadata
from index.filters import InvalidFilterValue
from index.records import Document, UnknownFilterField, id_problem
from index.search_index import MAX_SEARCH_WINDOW

router = APIRouter(route_class=StrictJSONRoute)
DocumentId = Annotated[str, Path(min_length=1, max_length=512)]


@router.post("/search", response_model=SearchResponse, tags=["search"])
async def search(body: SearchRequest, request: Request) -> SearchResponse:
    return await _search(request, body)


@router.get("/search", response_model=SearchResponse, tags=["search"])
async def search_get(
    request: Request,
    q: Annotated[str, Query(min_length=1, description="the query")],
    top_k: Annotated[int, Query(ge=1)] = 10,
    mode: SearchMode = "hybrid",
    include_text: bool = False,
    offset: Annotated[int, Query(ge=0, description="skip this many results")] = 0,
) -> SearchResponse:
    """For browsers and curl: ``/search?q=...&mode=bm25``."""
    return await _search(
        request, SearchRequest(query=q, top_k=top_k, mode=mode, include_text=include_text, offset=offset)
    )


async def _search(request: Request, body: SearchRequest) -> SearchResponse:
    started = time.perf_counter()
    settings, engines = request.app.state.settings, request.app.state.engines
    if len(body.query) > settings.max_chars:
        raise ApiError(422, f"query: over the limit of {settings.max_chars} characters", "query")
    if not body.query.strip():
        raise ApiError(422, "query: empty or only whitespace", "query")
    check_filter(body.filter, settings)
    if body.top_k > settings.max_top_k:
        raise ApiError(422, f"top_k: {body.top_k} is over the limit of {settings.max_top_k}", "top_k")
    if body.offset + body.top_k > MAX_SEARCH_WINDOW:
        raise ApiError(
            422,
            f"offset: offset + top_k is {body.offset + body.top_k}, over the limit of {MAX_SEARCH_WINDOW} "
            "(list documents with GET /documents to read further)",
            "offset",
        )
    index = engines.require_index()
    vector = None
    if body.mode != "bm25":
        encoder, batcher = engines.require_encoder()
        _, vectors = await submit(batcher, [body.query])
        vector = encoder.finish(vectors, normalize=True)[0]
    try:
        hits = await engines.run_search(
            index.search,
            vector,
            body.query,
            top_k=body.top_k,
            offset=body.offset,
            mode=body.mode,
            filters=body.filter,
        )
    except UnknownFilterField as exc:
        raise ApiError(422, f"{exc.field}: no document has this metadata field", exc.field) from exc
    except InvalidFilterValue as exc:
        raise ApiError(422, str(exc), exc.field) from exc
    results = [
        SearchResult(
            id=hit.id,
            score=hit.score,
            text=hit.text if body.include_text else None,
            chunk=hit.chunk,
            chunk_index=hit.chunk_index,
            metadata=hit.metadata,
        )
        for hit in hits
    ]
    return SearchResponse(
        results=results, took_ms=round((time.perf_counter() - started) * 1000, 3), mode=body.mode
    )


@router.put("/documents", response_model=UpsertResponse, tags=["documents"])
async def upsert_documents(
    documents: Annotated[list[DocumentIn], Body(min_length=1, fail_fast=True)], request: Request
) -> UpsertResponse:
    """Insert or replace. When this answers 200 the documents are committed to disk and searchable."""
    settings, engines = request.app.state.settings, request.app.state.engines
    if len(documents) > settings.max_inputs:
        raise ApiError(
            422, f"body: {len(documents)} documents, more than the limit of {settings.max_inputs}", "body"
        )
    ids = [doc.id for doc in documents]
    if len(set(ids)) != len(ids):
        raise ApiError(422, "body: the same id appears twice in one batch", "id")
    for position, doc in enumerate(documents):
        where = str(position)  # as FastAPI names a field of a list body: "0.text"
        if problem := id_problem(doc.id):
            raise ApiError(422, f"{where}.id: {problem}", f"{where}.id")
        if not doc.text.strip():
            raise ApiError(422, f"{where}.text: empty or only whitespace", f"{where}.text")
        if len(doc.text) > settings.max_document_chars:
            raise ApiError(
                422,
                f"{where}.text: {len(doc.text)} characters, over the limit of {settings.max_document_chars}",
                f"{where}.text",
            )
        check_metadata(doc.metadata, f"{where}.metadata", settings)
    if settings.index_read_only:
        raise ApiError(409, "the index is open read-only: change documents through the indexer")
    engines.require_encoder()
    index = engines.require_index()
    count = await engines.write_pool.run(
        index.upsert, [Document(d.id, d.text, d.metadata) for d in documents]
    )
    return UpsertResponse(upserted=count)


@router.get("/documents/{doc_id:path}", response_model=DocumentOut, tags=["documents"])
async def get_document(doc_id: DocumentId, request: Request) -> DocumentOut:
    engines = request.app.state.engines
    document = await engines.work_pool.run(engines.require_index().get, doc_id)
    if document is None:
        raise ApiError(404, f"no document with id {doc_id!r}", "doc_id")
    return DocumentOut(id=document.id, text=document.text, metadata=document.metadata)


@router.delete("/documents/{doc_id:path}", response_model=DeleteResponse, tags=["documents"])
async def delete_document(doc_id: DocumentId, request: Request) -> DeleteResponse:
    engines = request.app.state.engines
    if request.app.state.settings.index_read_only:
        raise ApiError(409, "the index is open read-only: change documents through the indexer")
    if not await engines.write_pool.run(engines.require_index().delete, doc_id):
        raise ApiError(404, f"no document with id {doc_id!r}", "doc_id")
    return DeleteResponse(deleted=doc_id)


@router.post(
    "/index/rebuild",
    status_code=202,
    response_model=JobAccepted,
    tags=["index"],
)
async def rebuild_index(request: Request) -> JobAccepted:
    """Re-embed every document into a new index version; searches use the old one until it is published."""
    if request.app.state.settings.index_read_only:  # at once, not a 202 for a job that must fail
        raise ApiError(409, "the index is open read-only: rebuild it with the indexer")
    index = request.app.state.engines.require_index()
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
