"""Embeddings (OpenAI-compatible and TEI's routes), similarity, tokens, and fill-mask (Hugging Face's shape).

The embedding routes answer with bytes serialised by orjson straight from the float32 matrix: a response
model of 384 floats per vector is validated and serialised element by element on the event loop, which is
the bottleneck of a 2-core server (see app/service/lane.py)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from starlette.datastructures import State

from app.service.engines import submit
from app.service.errors import ApiError
from app.service.route_table import declare
from app.service.schemas import (
    DecodeRequest,
    EmbedRequest,
    FillMaskRequest,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    Prediction,
    SimilarityRequest,
    SimpleToken,
    TokenizeRequest,
)
from app.service.validation import StrictJSONRoute, text_list
from encoder_runtime import EncoderRuntime, pipeline_output
from encoder_runtime.encoder import l2_normalize
from encoder_runtime.fill_mask import FillMaskQuery

router = APIRouter(route_class=StrictJSONRoute)


def json_response(content: object, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        media_type="application/json",
        headers=headers,
    )


def truncation_headers(items: list) -> dict[str, str] | None:
    """``X-Truncated-Inputs``: the positions of inputs cut to the model's window (this service's extension)."""
    truncated = [str(position) for position, item in enumerate(items) if item.truncated]
    return {"X-Truncated-Inputs": ",".join(truncated)} if truncated else None


def refuse_unsupported(prompt_name: str | None, truncation_direction: str, where: str = "") -> None:
    if prompt_name is not None:
        raise ApiError(422, f"{where}prompt_name: this model defines no prompts", f"{where}prompt_name")
    if truncation_direction != "right":
        field = f"{where}truncation_direction"
        raise ApiError(422, f"{field}: only 'right' is supported (inputs are cut at the end)", field)


def refuse_too_long(items: list, encoder: EncoderRuntime, field: str) -> None:
    for position, item in enumerate(items):
        if item.truncated:
            where = f"{field}[{position}]"
            raise ApiError(
                422,
                f"{where}: longer than the model's {encoder.max_tokens} tokens; send truncate=true",
                where,
            )


def keep_dimensions(matrix: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Matryoshka-style: the first ``dimensions`` values, re-normalised when the caller wants unit vectors."""
    if dimensions is None:
        return matrix
    if dimensions > matrix.shape[1]:
        raise ApiError(422, f"dimensions: {dimensions} > the model's {matrix.shape[1]}", "dimensions")
    matrix = matrix[:, :dimensions]
    return l2_normalize(matrix) if normalize else np.ascontiguousarray(matrix)


async def openai_answer(
    body: OpenAIEmbeddingRequest, state: State, _path_model: str | None = None
) -> Response:
    # The body names the model (this route has no /models/{name}/ form). Without CLOZE_MODELS it is ignored as
    # it always was (clients must send one, and any reached the one model); with it, it picks a served model
    # by name or alias, and absent or null means ``default``.
    model = body.model if state.settings.named_models else None
    encoder, _ = state.engines.require_encoder(model)
    texts = text_list(body.input, "input", state.settings)
    items, finished = await state.engines.embed(texts, normalize=None, model=model)
    matrix = keep_dimensions(finished, body.dimensions, normalize=True)
    tokens = sum(len(item) for item in items)
    if body.encoding_format == "base64":
        little = matrix.astype("<f4", copy=False)
        embeddings: list = [base64.b64encode(row.tobytes()).decode() for row in little]
    else:
        embeddings = list(matrix)
    return json_response(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": vector}
                for i, vector in enumerate(embeddings)
            ],
            "model": encoder.info.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        truncation_headers(items),
    )


async def embed_answer(body: EmbedRequest, state: State, model: str | None = None) -> Response:
    encoder, _ = state.engines.require_encoder(model)
    texts = text_list(body.inputs, "inputs", state.settings)
    refuse_unsupported(body.prompt_name, body.truncation_direction)
    cut = body.dimensions is not None  # normalised after the cut, if at all
    items, matrix = await state.engines.embed(texts, normalize=body.normalize and not cut, model=model)
    if not body.truncate:
        refuse_too_long(items, encoder, "inputs")
    if cut:
        matrix = keep_dimensions(matrix, body.dimensions, body.normalize)
    return json_response(matrix, truncation_headers(items))


# The hot routes: ``EmbeddingLane`` (app/service/lane.py) answers their paths, routed ahead of these, with the
# same functions; these give them their OpenAPI entries and declarations, and answer when no lane is installed.
@router.post(
    "/v1/embeddings",
    openapi_extra=declare("read"),
    response_model=OpenAIEmbeddingResponse,
    tags=["embeddings"],
)
async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request) -> Response:
    """OpenAI's embeddings API: the official client works with ``base_url`` pointed here (float and base64
    encodings, ``dimensions``). Inputs over the model's window are truncated, as OpenAI's are not: the
    ``X-Truncated-Inputs`` header lists which."""
    return await openai_answer(body, request.app.state)


@router.post("/embed", openapi_extra=declare("read"), response_model=list[list[float]], tags=["embeddings"])
async def embed(body: EmbedRequest, request: Request) -> Response:
    """TEI's ``/embed``: one vector per input, always a list of lists. Inputs over the model's window are
    refused unless ``truncate`` is true; ``dimensions`` keeps the first N values."""
    return await embed_answer(body, request.app.state)


@router.post(
    "/models/{model}/embed",
    openapi_extra=declare("read"),
    response_model=list[list[float]],
    tags=["named models"],
)
async def embed_with(model: str, body: EmbedRequest, request: Request) -> Response:
    """``/embed`` of the embedding model named ``model`` (``InferenceClient(model=f"{base}/models/{model}/embed")``)."""
    return await embed_answer(body, request.app.state, model)


# A lane's answer takes the model a ``/models/{model}/...`` path names (None for the plain route); the lane
# (app/service/lane.py) answers these routes' paths with these functions.
LaneAnswer = Callable[[Any, State, str | None], Awaitable[Response]]
LANES: dict[Callable[..., Any], tuple[type[BaseModel], LaneAnswer]] = {
    embed: (EmbedRequest, embed_answer),
    embed_with: (EmbedRequest, embed_answer),
    openai_embeddings: (OpenAIEmbeddingRequest, openai_answer),
}


@router.post("/similarity", openapi_extra=declare("read"), response_model=list[float], tags=["embeddings"])
async def similarity(body: SimilarityRequest, request: Request) -> Response:
    """TEI's ``/similarity`` (``InferenceClient.sentence_similarity``): the cosine similarity of
    ``source_sentence`` to each of ``sentences``, in their order."""
    return await similarity_answer(body, request.app.state)


@router.post(
    "/models/{model}/similarity",
    openapi_extra=declare("read"),
    response_model=list[float],
    tags=["named models"],
)
async def similarity_with(model: str, body: SimilarityRequest, request: Request) -> Response:
    """``/similarity`` of the embedding model named ``model``."""
    return await similarity_answer(body, request.app.state, model)


async def similarity_answer(body: SimilarityRequest, state: State, model: str | None = None) -> Response:
    engines, settings = state.engines, state.settings
    encoder, _ = engines.require_encoder(model)
    parameters = body.parameters
    if parameters is not None:
        refuse_unsupported(parameters.prompt_name, parameters.truncation_direction, "parameters.")
    [source] = text_list(body.inputs.source_sentence, "inputs.source_sentence", settings)
    sentences = text_list(body.inputs.sentences, "inputs.sentences", settings)
    if len(sentences) + 1 > settings.max_inputs:
        field = "inputs.sentences"
        raise ApiError(422, f"{field}: with the source, more than the limit of {settings.max_inputs}", field)
    items, matrix = await engines.embed([source, *sentences], normalize=True, model=model)
    if not (parameters and parameters.truncate):
        for position, item in enumerate(items):
            if item.truncated:
                where = "inputs.source_sentence" if position == 0 else f"inputs.sentences[{position - 1}]"
                raise ApiError(
                    422,
                    f"{where}: longer than the model's {encoder.max_tokens} tokens; send parameters.truncate=true",
                    where,
                )
    return json_response(matrix[1:] @ matrix[0], truncation_headers(items))


@router.post(
    "/tokenize", openapi_extra=declare("read"), response_model=list[list[SimpleToken]], tags=["tokens"]
)
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    """TEI's ``/tokenize``: per input, the embedding model's tokens (not truncated) with character offsets;
    special tokens have no offsets. Always a list of lists."""
    return await tokenize_answer(body, request.app.state)


@router.post(
    "/models/{model}/tokenize",
    openapi_extra=declare("read"),
    response_model=list[list[SimpleToken]],
    tags=["named models"],
)
async def tokenize_with(model: str, body: TokenizeRequest, request: Request) -> Response:
    """``/tokenize`` with the embedding model named ``model``."""
    return await tokenize_answer(body, request.app.state, model)


async def tokenize_answer(body: TokenizeRequest, state: State, model: str | None = None) -> Response:
    encoder, _ = state.engines.require_encoder(model)
    refuse_unsupported(body.prompt_name, "right")
    settings = state.settings
    texts = text_list(body.inputs, "inputs", settings)
    total = sum(len(text) for text in texts)
    if total > settings.max_tokenize_chars:
        raise ApiError(
            422,
            f"inputs: {total} characters in all, over the limit of {settings.max_tokenize_chars}",
            "inputs",
        )
    tokens = await state.engines.work_pool.run(encoder.tokenizer.tokens, texts, body.add_special_tokens)
    return json_response(tokens)


@router.post("/decode", openapi_extra=declare("read"), response_model=list[str], tags=["tokens"])
async def decode(body: DecodeRequest, request: Request) -> Response:
    """TEI's ``/decode``: token ids back to text, one string per list of ids (always a list)."""
    return await decode_answer(body, request.app.state)


@router.post(
    "/models/{model}/decode", openapi_extra=declare("read"), response_model=list[str], tags=["named models"]
)
async def decode_with(model: str, body: DecodeRequest, request: Request) -> Response:
    """``/decode`` with the embedding model named ``model``."""
    return await decode_answer(body, request.app.state, model)


async def decode_answer(body: DecodeRequest, state: State, model: str | None = None) -> Response:
    encoder, _ = state.engines.require_encoder(model)
    settings = state.settings
    batch = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
    if not batch or not all(batch):
        raise ApiError(422, "ids: empty: send at least one token id", "ids")
    if len(batch) > settings.max_inputs:
        raise ApiError(422, f"ids: {len(batch)} lists, more than the limit of {settings.max_inputs}", "ids")
    vocabulary = encoder.tokenizer.vocab_size
    for position, ids in enumerate(batch):
        where = "ids" if batch is not body.ids else f"ids[{position}]"
        if len(ids) > settings.max_chars:
            raise ApiError(422, f"{where}: {len(ids)} ids, over the limit of {settings.max_chars}", where)
        if any(not 0 <= token < vocabulary for token in ids):
            raise ApiError(422, f"{where}: token ids must lie in [0, {vocabulary})", where)
    texts = await state.engines.work_pool.run(encoder.tokenizer.decode, batch, body.skip_special_tokens)
    return json_response(texts)


FillMaskAnswer = list[Prediction] | list[list[Prediction]] | list[list[list[Prediction]]]


@router.post("/fill-mask", openapi_extra=declare("read"), response_model=FillMaskAnswer, tags=["fill-mask"])
async def fill_mask(body: FillMaskRequest, request: Request) -> Response:
    """Hugging Face's fill-mask (``InferenceClient.fill_mask`` sends ``{"inputs", "parameters": {"top_k",
    "targets"}}``), answered as the transformers pipeline nests it: one input with one mask, a flat list of
    predictions; several masks or several inputs, a list of lists. ``"nested": true`` (this service's
    extension) always answers [input][mask][prediction]."""
    return await fill_mask_answer(body, request.app.state)


@router.post(
    "/models/{model}/fill-mask",
    openapi_extra=declare("read"),
    response_model=FillMaskAnswer,
    tags=["named models"],
)
async def fill_mask_with(model: str, body: FillMaskRequest, request: Request) -> Response:
    """``/fill-mask`` with the fill-mask model named ``model`` (``CLOZE_FILL_MASK_MODELS``)."""
    return await fill_mask_answer(body, request.app.state, model)


async def fill_mask_answer(body: FillMaskRequest, state: State, model: str | None = None) -> Response:
    runtime, batcher = state.engines.require_fill_mask(model)
    settings = state.settings
    texts = text_list(body.inputs, "inputs", settings)
    top_k, targets = body.parameters.top_k, body.parameters.targets
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
    if targets:
        try:
            target_ids = tuple(runtime.target_ids(targets))
        except ValueError as exc:
            raise ApiError(422, f"parameters.targets: {exc}", "parameters.targets") from exc
    # Admitted by masks, the cost the head and the answer grow with (CLOZE_FILL_MASK_MAX_QUEUE).
    queries = [FillMaskQuery(text, target_ids) for text in texts]
    items, scores = await submit(batcher, queries, cost=masks)
    results = await state.engines.work_pool.run(
        lambda: [runtime.decode(t, i, s, top_k) for t, i, s in zip(texts, items, scores, strict=True)]
    )
    for position, result in enumerate(results):
        if result.masks_dropped:
            field = f"inputs[{position}]"
            raise ApiError(
                422,
                f"{field}: {result.masks_dropped} mask token(s) past the model's {runtime.max_tokens}-token window",
                field,
            )
    if body.nested:
        return json_response([result.masks for result in results])
    return json_response(pipeline_output(results, isinstance(body.inputs, list)))
