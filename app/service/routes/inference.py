"""Embeddings (OpenAI-compatible and TEI-style) and fill-mask."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request, Response

from app.service.auth import require_read
from app.service.engines import submit
from app.service.errors import ApiError
from app.service.schemas import (
    EmbedRequest,
    FillMaskRequest,
    OpenAIEmbedding,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    OpenAIUsage,
    Prediction,
)
from app.service.validation import StrictJSONRoute, text_list
from encoder_runtime.encoder import l2_normalize
from encoder_runtime.fill_mask import FillMaskQuery

router = APIRouter(dependencies=[require_read], route_class=StrictJSONRoute)


@router.post("/v1/embeddings", response_model=OpenAIEmbeddingResponse, tags=["embeddings"])
async def openai_embeddings(
    body: OpenAIEmbeddingRequest, request: Request, response: Response
) -> OpenAIEmbeddingResponse:
    """OpenAI's embeddings API: the official client works with ``base_url`` pointed here.

    Inputs over the model's window are truncated; the ``X-Truncated-Inputs`` header lists which."""
    encoder, batcher = request.app.state.engines.require_encoder()
    texts = text_list(body.input, "input", request.app.state.settings)
    items, vectors = await submit(batcher, texts)
    report_truncation(items, response)
    matrix = encoder.finish(vectors)
    if body.dimensions:
        if body.dimensions > matrix.shape[1]:
            raise ApiError(
                422, f"dimensions: {body.dimensions} > the model's {matrix.shape[1]}", "dimensions"
            )
        matrix = l2_normalize(matrix[:, : body.dimensions])  # Matryoshka-style truncation, re-normalised
    tokens = sum(len(item) for item in items)
    return OpenAIEmbeddingResponse(
        data=[
            OpenAIEmbedding(index=i, embedding=_encode_vector(v, body.encoding_format))
            for i, v in enumerate(matrix)
        ],
        model=encoder.info.model_id,
        usage=OpenAIUsage(prompt_tokens=tokens, total_tokens=tokens),
    )


def report_truncation(items: list, response: Response) -> None:
    truncated = [str(position) for position, item in enumerate(items) if item.truncated]
    if truncated:
        response.headers["X-Truncated-Inputs"] = ",".join(truncated)


def _encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


@router.post("/embed", response_model=list[list[float]], tags=["embeddings"])
async def embed(body: EmbedRequest, request: Request, response: Response) -> list[list[float]]:
    """TEI's ``/embed``. Inputs over the model's window are refused unless ``truncate`` is true."""
    encoder, batcher = request.app.state.engines.require_encoder()
    texts = text_list(body.inputs, "inputs", request.app.state.settings)
    items, vectors = await submit(batcher, texts)
    if not body.truncate:
        for position, item in enumerate(items):
            if item.truncated:
                field = f"inputs[{position}]"
                raise ApiError(
                    422,
                    f"{field}: longer than the model's {encoder.max_tokens} tokens; send truncate=true",
                    field,
                )
    report_truncation(items, response)
    return encoder.finish(vectors, normalize=body.normalize).tolist()


@router.post("/fill-mask", response_model=list[list[list[Prediction]]], tags=["fill-mask"])
async def fill_mask(body: FillMaskRequest, request: Request) -> list[list[list[dict]]]:
    """Per input, per mask token, the top-k predictions in the Hugging Face pipeline's shape."""
    runtime, batcher = request.app.state.engines.require_fill_mask()
    texts = text_list(body.inputs, "inputs", request.app.state.settings)
    settings = request.app.state.settings
    masks = 0
    for position, text in enumerate(texts):
        field = "inputs" if isinstance(body.inputs, str) else f"inputs[{position}]"
        count = runtime.mask_count(text)
        if not count:
            raise ApiError(
                422, f"{field}: no {runtime.mask_token} token; this model fills {runtime.mask_token}", field
            )
        if count > settings.max_masks:
            raise ApiError(
                422,
                f"{field}: {count} {runtime.mask_token} tokens, over the limit of {settings.max_masks}",
                field,
            )
        masks += count
    if masks > settings.fill_mask_max_queue:  # could never be admitted: a 429 would be a lie
        raise ApiError(
            422,
            f"inputs: {masks} {runtime.mask_token} tokens in one request, over the limit of "
            f"{settings.fill_mask_max_queue}",
            "inputs",
        )
    target_ids = None
    if body.targets:
        try:
            target_ids = tuple(runtime.target_ids(body.targets))
        except ValueError as exc:
            raise ApiError(422, f"targets: {exc}", "targets") from exc
    # Admitted by masks, the cost the head and the answer grow with (CLOZE_FILL_MASK_MAX_QUEUE).
    queries = [FillMaskQuery(text, target_ids) for text in texts]
    items, scores = await submit(batcher, queries, cost=masks)
    results = await request.app.state.engines.work_pool.run(
        lambda: [runtime.decode(t, i, s, body.top_k) for t, i, s in zip(texts, items, scores, strict=True)]
    )
    for position, result in enumerate(results):
        if result.masks_dropped:
            field = f"inputs[{position}]"
            raise ApiError(
                422,
                f"{field}: {result.masks_dropped} mask token(s) past the model's {runtime.max_tokens}-token window",
                field,
            )
    return [result.masks for result in results]
