"""Reranking with a cross-encoder (``CLOZE_RERANK_MODELS``): TEI's ``/rerank`` and Cohere's ``/v1/rerank`` and
``/v2/rerank`` (the paths ``cohere.Client`` and ``cohere.ClientV2`` post to, with ``base_url`` pointed here).

Every route scores through one entry point (``Engines.rerank``: the reranker's micro-batcher and its 429
policy) and answers best first; scores are the sigmoid of the model's logit (0..1) unless TEI's
``raw_scores`` asks for the logits."""

from __future__ import annotations

import uuid

import numpy as np
from fastapi import APIRouter, Request, Response
from starlette.datastructures import State

from app.service.errors import ApiError
from app.service.route_table import declare
from app.service.routes.inference import json_response, truncation_headers
from app.service.schemas import CohereDocument, CohereRerankRequest, RerankRequest, RerankResult
from app.service.validation import StrictJSONRoute, text_list
from encoder_runtime import sigmoid

router = APIRouter(route_class=StrictJSONRoute)


@router.post("/rerank", openapi_extra=declare("read"), response_model=list[RerankResult], tags=["rerank"])
async def rerank(body: RerankRequest, request: Request) -> Response:
    """TEI's ``/rerank``: each text scored against the query, best first, as ``[{index, score, text?}]``.
    A pair over the reranker's window is refused unless ``truncate`` is true (then the document is cut)."""
    return await tei_answer(body, request.app.state)


@router.post(
    "/models/{model}/rerank",
    openapi_extra=declare("read"),
    response_model=list[RerankResult],
    tags=["named models"],
)
async def rerank_with(model: str, body: RerankRequest, request: Request) -> Response:
    """``/rerank`` with the reranker named ``model``."""
    return await tei_answer(body, request.app.state, model)


@router.post("/v1/rerank", openapi_extra=declare("read"), tags=["rerank"])
async def cohere_v1(body: CohereRerankRequest, request: Request) -> Response:
    """Cohere's rerank v1 (``cohere.Client(base_url=...).rerank``): ``{id, results: [{index, relevance_score,
    document?}], meta}``, best first, the best ``top_n``. Pairs over the window are cut on the document side
    (Cohere truncates long documents too); ``X-Truncated-Inputs`` lists which."""
    return await cohere_answer(body, request.app.state, "1")


@router.post("/v2/rerank", openapi_extra=declare("read"), tags=["rerank"])
async def cohere_v2(body: CohereRerankRequest, request: Request) -> Response:
    """Cohere's rerank v2 (``cohere.ClientV2(base_url=...).rerank``), answered as v1 is."""
    return await cohere_answer(body, request.app.state, "2")


async def tei_answer(body: RerankRequest, state: State, model: str | None = None) -> Response:
    runtime, _ = state.engines.require_reranker(model)
    query, texts = checked_pair_texts(body.query, body.texts, "texts", state)
    if body.truncation_direction.lower() != "right":
        field = "truncation_direction"
        raise ApiError(422, f"{field}: only 'right' is supported (a document is cut at its end)", field)
    items, logits = await state.engines.rerank(query, texts, model)
    if not body.truncate:
        for position, item in enumerate(items):
            if item.truncated:
                where = f"texts[{position}]"
                raise ApiError(
                    422,
                    f"{where}: with the query, longer than the reranker's {runtime.max_tokens} tokens; "
                    "send truncate=true",
                    where,
                )
    scores = logits if body.raw_scores else sigmoid(logits)
    return json_response(
        [
            {"index": i, "score": float(scores[i])} | ({"text": texts[i]} if body.return_text else {})
            for i in best_first(scores)
        ],
        truncation_headers(items),
    )


async def cohere_answer(body: CohereRerankRequest, state: State, version: str) -> Response:
    if body.rank_fields not in (None, ["text"]):
        raise ApiError(
            422, "rank_fields: only ['text'] is supported (the field that is scored)", "rank_fields"
        )
    state.engines.require_reranker(body.model)  # 404 / 503 before the texts are checked
    documents = [
        document.text if isinstance(document, CohereDocument) else document for document in body.documents
    ]
    query, texts = checked_pair_texts(body.query, documents, "documents", state)
    items, logits = await state.engines.rerank(query, texts, body.model)
    scores = sigmoid(logits)
    results = []
    for i in best_first(scores)[: body.top_n]:
        result: dict = {"index": i, "relevance_score": float(scores[i])}
        if body.return_documents:
            sent = body.documents[i]
            result["document"] = sent.model_dump() if isinstance(sent, CohereDocument) else {"text": sent}
        results.append(result)
    tokens = sum(len(item) for item in items)
    meta = {"api_version": {"version": version}, "billed_units": {"search_units": 1, "input_tokens": tokens}}
    return json_response(
        {"id": str(uuid.uuid4()), "results": results, "meta": meta}, truncation_headers(items)
    )


def checked_pair_texts(query: str, texts: list[str], field: str, state: State) -> tuple[str, list[str]]:
    """The query and documents within the service's limits (422 naming the field): a non-empty query of at
    most CLOZE_MAX_CHARS, 1..CLOZE_MAX_INPUTS documents of at most CLOZE_MAX_CHARS each, and no more pairs
    than the reranker's queue could ever admit."""
    settings = state.settings
    [query] = text_list(query, "query", settings)
    texts = text_list(texts, field, settings)
    if len(texts) > settings.max_queue:  # could never be admitted: a 429 would be a lie
        raise ApiError(422, f"{field}: {len(texts)} documents, over the queue's {settings.max_queue}", field)
    return query, texts


def best_first(scores: np.ndarray) -> list[int]:
    """Positions by score, best first; equal scores keep the order they were sent in."""
    return [int(i) for i in np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")]
