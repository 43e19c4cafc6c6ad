"""Models, health, readiness and metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.service.model_registry import INDEX_MODEL, ModelSlot

router = APIRouter(tags=["operations"])


@router.get("/models")
async def models(request: Request) -> dict:
    """The models served: ``models``, ``fill_mask_models`` and ``rerank_models`` list each by name (with its
    kind, aliases, status and, once loaded, fingerprint, dimension, pooling, backend and device); ``embedding``
    and ``fill_mask`` are the ``default`` ones, as before named models, and ``rerank_default`` the reranker a
    request without ``model`` gets (null when none is configured)."""
    engines = request.app.state.engines
    encoder, _ = engines.require_encoder()
    answer = {
        "embedding": _embedding_model(encoder),
        "fill_mask": None,
        "fill_mask_error": engines.fill_mask_error,
        # The manifest counts rows: in a worker thread, never on the event loop.
        "index": await engines.work_pool.run(lambda: engines.index.manifest)
        if engines.index is not None
        else None,
        "index_model": INDEX_MODEL,
        "models": [_listing(slot, "embedding", _embedding_model) for slot in engines.models.slots.values()],
        "fill_mask_models": [
            _listing(slot, "fill-mask", _fill_mask_model) for slot in engines.fill_masks.slots.values()
        ],
        "rerank_models": [_listing(slot, "rerank", _runtime) for slot in engines.rerankers.slots.values()],
        "rerank_default": engines.rerankers.default_name,
    }
    if engines.fill_mask is not None:
        answer["fill_mask"] = _fill_mask_model(engines.fill_mask)
    return answer


@router.get("/v1/models")
async def openai_models(request: Request) -> dict:
    """OpenAI's model list (``client.models.list()``): the embedding models that are loaded, by name."""
    slots = request.app.state.engines.models.slots.values()
    return {
        "object": "list",
        "data": [
            {"id": slot.name, "object": "model", "created": 0, "owned_by": "cloze-search"}
            for slot in slots
            if slot.runtime is not None
        ],
    }


def _listing(slot: ModelSlot, kind: str, describe: Callable[[Any], dict]) -> dict:
    entry = {
        "id": slot.name,
        "kind": kind,
        "aliases": slot.aliases,
        "status": slot.status,
        "error": slot.error,
    }
    return {**entry, **describe(slot.runtime)} if slot.runtime is not None else entry


def _device(provider: str) -> str:
    """``cuda`` or ``cpu``, from what the backend says runs (``cuda fp16``, ``CUDAExecutionProvider``...)."""
    return "cuda" if "cuda" in provider.lower() else "cpu"


def _runtime(runtime: Any) -> dict:
    """What every loaded model reports: where it came from and what runs it."""
    return {
        "model_id": runtime.info.model_id,
        "path": str(runtime.info.path),
        "fingerprint": runtime.info.fingerprint,
        "max_tokens": runtime.max_tokens,
        "backend": runtime.backend.name,
        "provider": runtime.backend.provider,
        "device": _device(runtime.backend.provider),
    }


def _embedding_model(encoder: Any) -> dict:
    return _runtime(encoder) | {
        "dimension": encoder.dimension,
        "pooling": encoder.info.pooling,
        "normalize": encoder.info.normalize,
    }


def _fill_mask_model(fill: Any) -> dict:
    return _runtime(fill) | {"mask_token": fill.mask_token}


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    """Liveness: 200 while the process is or can still become ready (models may be loading or retrying);
    503 once it never will (the embedding model failed every attempt), so an orchestrator replaces it."""
    engines = request.app.state.engines
    if engines.load_failed:
        return JSONResponse({"status": "failed", "ready": False}, 503)
    return JSONResponse({"status": "ok", "ready": engines.ready})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready to serve: the embedding model and the index are loaded (and a replica holds a copy); else why
    not (with read keys set, only for a key holder: the reasons name files). ``replication`` says how
    current a replica is (applied sequence, lag, staleness) or how far a writer has shipped."""
    engines, replication = request.app.state.engines, request.app.state.replication
    copy = replication.status()  # a replica stays ready while stale: it says how stale instead
    if engines.ready and replication.ready:
        answer = {
            "status": "ready",
            "fill_mask": engines.fill_mask is not None,
            "fill_mask_error": engines.fill_mask_error,
        }
        return JSONResponse(answer | ({"replication": copy} if copy else {}))
    reason = engines.load_error or engines.index_error or (copy or {}).get("waiting") or "loading"
    headers = None if engines.load_failed else {"Retry-After": "2"}
    return JSONResponse(
        {
            "status": "failed" if engines.load_failed else "not ready",
            "reason": reason,
            "attempts": engines.load_attempts,
        },
        503,
        headers=headers,
    )


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text. Index sizes come from figures refreshed in the background: a scrape counts no rows."""
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
