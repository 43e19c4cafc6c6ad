"""Models, health, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.service.auth import require_read

router = APIRouter(tags=["operations"])


@router.get("/models", dependencies=[require_read])
async def models(request: Request) -> dict:
    engines = request.app.state.engines
    encoder, _ = engines.require_encoder()
    answer = {
        "embedding": {
            "model_id": encoder.info.model_id,
            "path": str(encoder.info.path),
            "fingerprint": encoder.info.fingerprint,
            "dimension": encoder.dimension,
            "max_tokens": encoder.max_tokens,
            "pooling": encoder.info.pooling,
            "normalize": encoder.info.normalize,
            "backend": encoder.backend.name,
            "provider": encoder.backend.provider,
        },
        "fill_mask": None,
        "fill_mask_error": engines.fill_mask_error,
        "index": engines.index.manifest if engines.index is not None else None,
    }
    if engines.fill_mask is not None:
        fill = engines.fill_mask
        answer["fill_mask"] = {
            "model_id": fill.info.model_id,
            "path": str(fill.info.path),
            "mask_token": fill.mask_token,
            "max_tokens": fill.max_tokens,
            "backend": fill.backend.name,
            "provider": fill.backend.provider,
        }
    return answer


@router.get("/healthz")
async def healthz() -> dict:
    """The process is alive (models may still be loading)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready to serve: the embedding model and the index are loaded."""
    engines = request.app.state.engines
    if engines.ready:
        return JSONResponse({"status": "ready", "fill_mask": engines.fill_mask is not None})
    reason = engines.load_error or engines.index_error or "loading"
    return JSONResponse({"status": "not ready", "reason": reason}, 503, headers={"Retry-After": "2"})


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
