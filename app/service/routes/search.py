"""Search: dense, BM25 and hybrid (reciprocal rank fusion or a convex combination), with metadata filters,
highlights and per-hit explanations."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from app.service.collections import Collection
from app.service.errors import ApiError
from app.service.routes.collections import current_collection
from app.service.schemas import (
    IndexFields,
    SearchExplanation,
    SearchMode,
    SearchRequest,
    SearchResponse,
    SearchResult,
)
from app.service.validation import StrictJSONRoute, check_filter
from index.filters import InvalidFilterValue
from index.ranking import RRF_K, Fusion
from index.records import UnknownFilterField
from index.search_index import MAX_SEARCH_WINDOW

router = APIRouter(route_class=StrictJSONRoute)
InCollection = Annotated[Collection, Depends(current_collection)]


@router.post("/search", response_model=SearchResponse, tags=["search"])
async def search(body: SearchRequest, request: Request, collection: InCollection) -> SearchResponse:
    return await _search(request, body, collection)


@router.get("/search", response_model=SearchResponse, tags=["search"])
async def search_get(
    request: Request,
    collection: InCollection,
    q: Annotated[str, Query(min_length=1, description="the query")],
    top_k: Annotated[int, Query(ge=1)] = 10,
    mode: SearchMode = "hybrid",
    include_text: bool = False,
    offset: Annotated[int, Query(ge=0, description="skip this many results")] = 0,
    highlight: Annotated[bool, Query(description="return each hit's highlights")] = False,
    explain: Annotated[bool, Query(description="return each hit's explain")] = False,
) -> SearchResponse:
    """For browsers and curl: ``/search?q=...&mode=bm25``."""
    body = SearchRequest(
        query=q,
        top_k=top_k,
        mode=mode,
        include_text=include_text,
        offset=offset,
        highlight=highlight,
        explain=explain,
    )
    return await _search(request, body, collection)


def _fusion(body: SearchRequest) -> Fusion | None:
    """The index's ``Fusion`` for the request's; each parameter belongs to one method."""
    chosen = body.fusion
    if chosen is None:
        return None
    if body.mode != "hybrid":
        raise ApiError(422, f"fusion: applies to mode hybrid only, not {body.mode}", "fusion")
    if chosen.method == "rrf" and chosen.alpha is not None:
        raise ApiError(422, "fusion.alpha: applies to method convex only", "fusion.alpha")
    if chosen.method == "convex" and chosen.k is not None:
        raise ApiError(422, "fusion.k: applies to method rrf only", "fusion.k")
    if chosen.method == "convex":
        return Fusion("convex", alpha=0.5 if chosen.alpha is None else chosen.alpha)
    return Fusion("rrf", k=RRF_K if chosen.k is None else chosen.k)


async def _search(request: Request, body: SearchRequest, collection: Collection) -> SearchResponse:
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
    fusion = _fusion(body)
    index = collection.require_index()
    vector = None
    if body.mode != "bm25":
        _, vectors = await engines.embed([body.query], model=collection.model)
        vector = vectors[0]
    try:
        hits = await engines.run_search(
            index.search,
            vector,
            body.query,
            top_k=body.top_k,
            offset=body.offset,
            mode=body.mode,
            filters=body.filter,
            fusion=fusion,
            explained=body.explain,
            highlight=body.highlight,
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
            highlights=hit.highlights,
            explain=SearchExplanation(**asdict(hit.explanation)) if hit.explanation is not None else None,
        )
        for hit in hits
    ]
    return SearchResponse(
        results=results, took_ms=round((time.perf_counter() - started) * 1000, 3), mode=body.mode
    )


@router.get("/index/fields", response_model=IndexFields, tags=["search"])
async def index_fields(request: Request, collection: InCollection) -> IndexFields:
    """Metadata field names the search filters accept (an unknown field is a 422 from ``/search``)."""
    index, pool = collection.require_index(), request.app.state.engines.work_pool
    fields = await pool.run(index.metadata_fields)
    return IndexFields(fields=sorted(fields), counts=await pool.run(index.stats))
