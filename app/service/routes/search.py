"""Search: dense, BM25 and hybrid (reciprocal rank fusion or a convex combination), with metadata filters,
highlights and per-hit explanations, and optionally a cross-encoder that re-scores the best candidates."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from opentelemetry import trace

from app.service.collections import Collection
from app.service.errors import ApiError
from app.service.route_table import declare
from app.service.routes.collections import current_collection
from app.service.routes.rerank import best_first
from app.service.schemas import (
    FacetsRequest,
    FacetsResponse,
    IndexFields,
    RerankIn,
    SearchExplanation,
    SearchMode,
    SearchRequest,
    SearchResponse,
    SearchResult,
)
from app.service.validation import StrictJSONRoute, check_filter, check_filter_fields
from encoder_runtime import sigmoid
from encoder_runtime.tracing import child_span
from index.build.own_vectors import InvalidVector, OwnVectors
from index.query.ranking import RRF_K, Fusion
from index.records import metadata_key_problem
from index.search_index import MAX_SEARCH_WINDOW

router = APIRouter(route_class=StrictJSONRoute)
tracer = trace.get_tracer(__name__)
InCollection = Annotated[Collection, Depends(current_collection)]


@router.post(
    "/search", openapi_extra=declare("read", "collection"), response_model=SearchResponse, tags=["search"]
)
async def search(body: SearchRequest, request: Request, collection: InCollection) -> SearchResponse:
    return await _search(request, body, collection)


@router.get(
    "/search", openapi_extra=declare("read", "collection"), response_model=SearchResponse, tags=["search"]
)
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
    rerank: Annotated[
        int | None, Query(ge=1, description="rerank this many candidates with the default reranker")
    ] = None,
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
        rerank=RerankIn(candidates=rerank) if rerank is not None else None,
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
    if body.vector is not None and body.query is None and "mode" not in body.model_fields_set:
        body = body.model_copy(update={"mode": "dense"})  # a vector alone searches by vector
    with child_span(tracer, "search") as span:
        if span.is_recording():  # the attributes only for a span that keeps them
            span.set_attributes(_described(body, collection))
        response = await _answer(request, body, collection)
        span.set_attribute("cloze.results", len(response.results))
        return response


def _described(body: SearchRequest, collection: Collection) -> dict[str, str | int | bool]:
    """The search span's attributes: what was asked, never the query's text or the filter's values."""
    attributes: dict[str, str | int | bool] = {
        "cloze.collection": collection.name,
        "cloze.search.mode": body.mode,
        "cloze.search.k": body.top_k,
        "cloze.search.offset": body.offset,
        "cloze.search.filtered": bool(body.filter),
    }
    if body.fusion is not None:
        attributes["cloze.fusion"] = body.fusion.method
    if body.rerank is not None:
        attributes["cloze.rerank.candidates"] = body.rerank.candidates
    return attributes


async def _answer(request: Request, body: SearchRequest, collection: Collection) -> SearchResponse:
    started = time.perf_counter()
    settings, engines = request.app.state.settings, request.app.state.engines
    _check_query(body, settings.max_chars)
    tree = check_filter(body.filter, settings)
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
    _check_rerank(body, request)
    index = collection.require_index()
    await check_filter_fields(index, tree, settings, engines.work_pool)
    vector = await _query_vector(body, collection, engines)
    query = body.query or ""
    # Reranked: the first stage's best ``candidates`` (from the top), re-scored, then the page is cut.
    window = (0, body.rerank.candidates) if body.rerank else (body.offset, body.top_k)
    hits = await engines.run_search(
        index.search,
        vector,
        query,
        top_k=window[1],
        offset=window[0],
        mode=body.mode,
        filters=tree,
        fusion=fusion,
        explained=body.explain,
        highlight=body.highlight,
        text_chars=_text_needed(body, request),
    )
    ranked = [(hit, hit.score, None, None) for hit in hits]
    if body.rerank is not None:
        ranked = (await _reranked(hits, body, request))[body.offset : body.offset + body.top_k]
    texts = await _shown_texts(ranked, body, request, index)
    results = [
        SearchResult(
            id=hit.id,
            score=score,
            text=texts.get(hit.id) if body.include_text else None,
            chunk=hit.chunk,
            chunk_index=hit.chunk_index,
            metadata=hit.metadata,
            highlights=hit.highlights,
            explain=SearchExplanation(
                **asdict(hit.explanation), rerank_score=rerank_score, first_stage_rank=first_rank
            )
            if hit.explanation is not None
            else None,
        )
        for hit, score, rerank_score, first_rank in ranked
    ]
    return SearchResponse(
        results=results, took_ms=round((time.perf_counter() - started) * 1000, 3), mode=body.mode
    )


def _text_needed(body: SearchRequest, request: Request) -> int | None:
    """How much of each candidate's document text the first stage reads: the reranker's ``CLOZE_MAX_CHARS``
    to rerank it, all of it to show it (without a rerank), none otherwise: a long document is never read
    whole for a candidate the answer does not show."""
    if body.rerank is not None:
        return request.app.state.settings.max_chars if body.rerank.text == "document" else 0
    return None if body.include_text else 0


async def _shown_texts(
    ranked: list[tuple], body: SearchRequest, request: Request, index: Any
) -> dict[str, str]:
    """The texts ``include_text`` shows (a reranked page's read whole now, only for the page), refused
    with 422 past ``CLOZE_MAX_PAGE_BYTES`` together: an answer is bounded in bytes, not only in hits."""
    if not body.include_text:
        return {}
    hits = [hit for hit, *_ in ranked]
    if body.rerank is None:
        texts = {hit.id: hit.text for hit in hits}
    else:
        with child_span(tracer, "store.read", {"cloze.documents": len(hits)}):
            found = await request.app.state.engines.work_pool.run(lambda: [index.get(hit.id) for hit in hits])
        texts = {doc.id: doc.text for doc in found if doc is not None}
    limit = request.app.state.settings.max_page_bytes
    total = sum(len(text) for text in texts.values())
    if total > limit:
        raise ApiError(
            422,
            f"include_text: the {len(texts)} results' texts total {total} characters, over the {limit} an answer "
            "carries (CLOZE_MAX_PAGE_BYTES): ask fewer results, or read long documents with GET /documents/{id}",
            "include_text",
        )
    return texts


def _check_query(body: SearchRequest, max_chars: int) -> None:
    """The query's text where the mode (or a reranker) reads words or must embed it; a vector only where
    the mode ranks by vectors."""
    if body.query is not None:
        if len(body.query) > max_chars:
            raise ApiError(422, f"query: over the limit of {max_chars} characters", "query")
        if not body.query.strip():
            raise ApiError(422, "query: empty or only whitespace", "query")
    elif body.mode != "dense" or body.vector is None:
        raise ApiError(422, f"query: mode {body.mode} needs the query's text", "query")
    elif body.rerank is not None:
        raise ApiError(422, "query: a reranker reads the query's text", "query")
    if body.vector is not None and body.mode == "bm25":
        raise ApiError(422, "vector: mode bm25 ranks by words only (use dense or hybrid)", "vector")


async def _query_vector(body: SearchRequest, collection: Collection, engines: Any) -> np.ndarray | None:
    """The vector dense and hybrid rank by: the request's (checked, normalised for cosine), else the
    collection's model's embedding of the query; a collection of the caller's own vectors has no model."""
    if body.mode == "bm25":
        return None
    own = collection.info.own_vectors()
    if body.vector is None and own is not None:
        raise ApiError(
            422,
            f"vector: mode {body.mode} needs the query's vector in a collection of your own vectors",
            "vector",
        )
    if body.vector is None:
        _, vectors = await engines.embed([body.query], model=collection.model)
        return vectors[0]
    shape = own or OwnVectors(engines.require_encoder(collection.model)[0].dimension, "cosine")
    try:
        return shape.vector(body.vector, "vector")
    except InvalidVector as exc:
        raise ApiError(422, str(exc), exc.field) from exc


def _check_rerank(body: SearchRequest, request: Request) -> None:
    """422 naming the field for a rerank this service cannot do: no reranker configured, an unknown one (404),
    too many candidates, or fewer than the page needs."""
    chosen = body.rerank
    if chosen is None:
        return
    engines, limit = request.app.state.engines, request.app.state.settings.max_rerank_candidates
    if not engines.rerankers.slots:
        raise ApiError(
            422, "rerank: this service serves no reranker (configure CLOZE_RERANK_MODELS)", "rerank"
        )
    engines.require_reranker(chosen.model, "rerank.model")
    if chosen.candidates > limit:
        field = "rerank.candidates"
        raise ApiError(422, f"{field}: {chosen.candidates} is over the limit of {limit}", field)
    if chosen.candidates < body.offset + body.top_k:
        field = "rerank.candidates"
        raise ApiError(
            422,
            f"{field}: {chosen.candidates} is fewer than offset + top_k ({body.offset + body.top_k}): the page "
            "is cut from the reranked candidates",
            field,
        )


async def _reranked(hits: list, body: SearchRequest, request: Request) -> list[tuple]:
    """(hit, reranker's relevance, the same, first-stage rank) for every candidate, best first. A document's
    text is cut at CLOZE_MAX_CHARS characters before tokenising (the reranker reads less than that anyway)."""
    chosen, max_chars = body.rerank, request.app.state.settings.max_chars
    if not hits:
        return []
    texts = [(hit.chunk if chosen.text == "chunk" else hit.text)[:max_chars] for hit in hits]
    _, logits = await request.app.state.engines.rerank(body.query, texts, chosen.model, "rerank.model")
    scores = sigmoid(logits)
    return [(hits[i], float(scores[i]), float(scores[i]), i + 1) for i in best_first(scores)]


@router.get(
    "/index/fields", openapi_extra=declare("read", "collection"), response_model=IndexFields, tags=["search"]
)
async def index_fields(request: Request, collection: InCollection) -> IndexFields:
    """Metadata field names some document holds (a filter on another matches nothing, or is a 422 from
    ``/search`` with ``CLOZE_STRICT_FILTER_FIELDS``)."""
    index, pool = collection.require_index(), request.app.state.engines.work_pool
    fields = await pool.run(index.metadata_fields)
    return IndexFields(fields=sorted(fields), counts=await pool.run(index.stats))


@router.post(
    "/facets", openapi_extra=declare("read", "collection"), response_model=FacetsResponse, tags=["search"]
)
async def facets(body: FacetsRequest, request: Request, collection: InCollection) -> FacetsResponse:
    """What the documents matching ``filter`` hold in ``fields``: each field's type, its most frequent values with
    their document counts, and its least and greatest number and date (from the in-memory columns)."""
    started = time.perf_counter()
    settings, engines = request.app.state.settings, request.app.state.engines
    tree = check_filter(body.filter, settings)
    for position, name in enumerate(body.fields):
        if problem := metadata_key_problem(name):
            raise ApiError(422, f"fields[{position}]: {problem}", f"fields[{position}]")
    index = collection.require_index()
    await check_filter_fields(index, tree, settings, engines.work_pool)
    found = await engines.work_pool.run(index.facets, tree, list(dict.fromkeys(body.fields)), body.top)
    return FacetsResponse(**found, took_ms=round((time.perf_counter() - started) * 1000, 3))
