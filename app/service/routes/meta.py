"""Models, health, readiness and metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from app.service.auth import Grant
from app.service.model_registry import INDEX_MODEL, ModelSlot
from app.service.route_table import declare
from index.collections import DEFAULT_COLLECTION

router = APIRouter(tags=["operations"])


@router.get("/models", openapi_extra=declare("read"))
async def models(request: Request) -> dict:
    """The models served: ``models``, ``fill_mask_models`` and ``rerank_models`` list each by name (with its
    kind, aliases, status and, once loaded, fingerprint, dimension, pooling, backend and device); ``embedding``
    and ``fill_mask`` are the ``default`` ones, as before named models, and ``rerank_default`` the reranker a
    request without ``model`` gets (null when none is configured). A key scoped to collections sees neither
    the collection ``default``'s manifest (unless it is one of its collections) nor where models lie on disk."""
    engines, grant = request.app.state.engines, getattr(request.state, "grant", None)
    encoder, _ = engines.require_encoder()
    fill_mask, index = engines.fill_masks.default, engines.collections.default.index
    answer = {
        "embedding": _embedding_model(encoder),
        "fill_mask": _fill_mask_model(fill_mask.runtime) if fill_mask.runtime is not None else None,
        "fill_mask_error": fill_mask.error,
        # The manifest counts rows: in a worker thread, never on the event loop.
        "index": await engines.work_pool.run(lambda: index.manifest)
        if index is not None and (grant is None or grant.may_read(DEFAULT_COLLECTION))
        else None,
        "index_model": INDEX_MODEL,
        "models": [_listing(slot, "embedding", _embedding_model) for slot in engines.models.slots.values()],
        "fill_mask_models": [
            _listing(slot, "fill-mask", _fill_mask_model) for slot in engines.fill_masks.slots.values()
        ],
        "rerank_models": [_listing(slot, "rerank", _runtime) for slot in engines.rerankers.slots.values()],
        "rerank_default": engines.rerankers.default_name,
    }
    return answer if grant is None or grant.collections is None else _without_paths(answer)


def _without_paths(listing: Any) -> Any:
    """The listing less every model's ``path`` (a folder on the server)."""
    if isinstance(listing, dict):
        return {key: _without_paths(value) for key, value in listing.items() if key != "path"}
    if isinstance(listing, list):
        return [_without_paths(value) for value in listing]
    return listing


@router.get("/v1/models", openapi_extra=declare("read"))
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


@router.get("/healthz", openapi_extra=declare("public"))
async def healthz(request: Request) -> JSONResponse:
    """Liveness: 200 while the process is or can still become ready (models may be loading or retrying);
    503 once it never will (the embedding model failed every attempt), so an orchestrator replaces it."""
    engines = request.app.state.engines
    if engines.load_failed:
        return JSONResponse({"status": "failed", "ready": False}, 503)
    return JSONResponse({"status": "ok", "ready": engines.ready})


@router.get("/readyz", openapi_extra=declare("probe"))
async def readyz(request: Request) -> JSONResponse:
    """Ready to serve: the default embedding model is loaded and the collection ``default`` is open and
    reads (the probe of every round) and, on a replica, holds a copy of the writer's (on a writer, it has read
    the bucket's registry and each ``CURRENT.json`` since it started); else 503 with why.
    ``collections`` reports each collection's status and error: another collection that fails answers 503
    on its own routes but does not take the service out of rotation. With replication, each collection's
    entry carries ``replication``: how current a replica's copy is (applied sequence, lag, staleness; a stale
    replica stays ready and says so) or how far a writer has shipped it; a collection the writer lists that
    a replica cannot copy (its model is not configured here) is listed as failed, saying why; top-level
    ``replication`` gives the role, the registry's last error and the fence. With keys set, everyone gets
    ``status`` and ``ready`` (orchestrators probe without secrets), a key scoped to collections those
    collections' entries too, and only an unscoped key the rest (the reasons name files)."""
    engines, replication = request.app.state.engines, request.app.state.replication
    collections: dict[str, dict[str, Any]] = {
        name: {"status": collection.status, "error": collection.error}
        for name, collection in engines.collections.collections.items()
    }
    states = await run_in_threadpool(replication.status)  # reads each collection's position: SQLite
    for name, state in states.items():  # a listed collection a replica cannot copy is served nowhere
        collections.setdefault(name, {"status": "failed", "error": state.get("error")})["replication"] = state
    overall = replication.summary()  # None: this service replicates nothing
    summary = {} if overall is None else {"replication": overall}
    grant = getattr(request.state, "grant", None)
    if engines.ready and replication.ready(states):
        fill_mask = engines.fill_masks.default
        answer = {
            "status": "ready",
            "ready": True,
            "fill_mask": fill_mask.runtime is not None,
            "fill_mask_error": fill_mask.error,
            "collections": collections,
        }
        return JSONResponse(_shown_to(grant, answer | summary))
    reason = (
        engines.models.default.error
        or engines.collections.default.error
        or states.get(DEFAULT_COLLECTION, {}).get("waiting")
        or "loading"
    )
    headers = None if engines.load_failed else {"Retry-After": "2"}
    answer = {
        "status": "failed" if engines.load_failed else "not ready",
        "ready": False,
        "reason": reason,
        "attempts": engines.load_attempts,
        "collections": collections,
    }
    return JSONResponse(_shown_to(grant, answer | summary), 503, headers=headers)


def _shown_to(grant: Grant | None, answer: dict[str, Any]) -> dict[str, Any]:
    """All of ``answer`` for an unscoped key (or where none is needed); for anyone else its status, its
    ready flag and the entries of the collections the caller's key may read (none without a key)."""
    if grant is None or grant.collections is None:
        return answer
    visible = {name: entry for name, entry in answer["collections"].items() if grant.may_read(name)}
    return {"status": answer["status"], "ready": answer["ready"]} | (
        {"collections": visible} if visible else {}
    )


@router.get("/metrics", openapi_extra=declare("operations"), include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text. Index sizes come from figures refreshed in the background: a scrape counts no rows."""
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
