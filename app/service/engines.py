"""What the routes need, loaded in the background so /healthz answers while models load."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import faiss
from starlette.concurrency import run_in_threadpool

from app.service.errors import ApiError
from app.service.metrics import Metrics
from app.settings import Settings
from encoder_runtime import (
    EncoderRuntime,
    FillMaskRuntime,
    MicroBatcher,
    Overloaded,
    load_encoder,
    load_fill_mask,
)
from index.search_index import SearchIndex

log = logging.getLogger("cloze.service")
RELOAD_EVERY_S = 2.0


@dataclass
class Engines:
    encoder: EncoderRuntime | None = None
    embed_batcher: MicroBatcher | None = None
    fill_mask: FillMaskRuntime | None = None
    fill_mask_batcher: MicroBatcher | None = None
    fill_mask_error: str | None = None
    index: Any = None  # index.SearchIndex
    index_error: str | None = None
    load_error: str | None = None
    # Searches run here, first come first served, one per core: on anyio's 40-thread pool sixteen
    # concurrent searches share two cores and all finish late (c=16 p99 of hybrid /search: benchmarks/results/search_latency.json).
    search_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="search")
    )

    async def run_search(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.search_pool, functools.partial(function, *args, **kwargs))

    @property
    def ready(self) -> bool:
        return self.encoder is not None and self.index is not None

    def require_encoder(self) -> tuple[EncoderRuntime, MicroBatcher]:
        if self.encoder is None or self.embed_batcher is None:
            raise ApiError(503, self.load_error or "model is loading", headers={"Retry-After": "2"})
        return self.encoder, self.embed_batcher

    def require_fill_mask(self) -> tuple[FillMaskRuntime, MicroBatcher]:
        if self.fill_mask is None or self.fill_mask_batcher is None:
            reason = self.fill_mask_error or "fill-mask model is loading"
            raise ApiError(503, reason, headers={"Retry-After": "2"} if not self.fill_mask_error else None)
        return self.fill_mask, self.fill_mask_batcher

    def require_index(self) -> Any:
        if self.index is None:
            raise ApiError(503, self.index_error or "index is loading", headers={"Retry-After": "2"})
        return self.index


async def submit(batcher: MicroBatcher, texts: list[str]) -> tuple[list, list]:
    """The batcher's answer, or 429 with Retry-After when its queue is full."""
    try:
        return await batcher.submit(texts)
    except Overloaded as exc:
        raise ApiError(429, str(exc), headers={"Retry-After": str(max(1, round(exc.retry_after)))}) from exc


def _batcher(
    runtime: EncoderRuntime | FillMaskRuntime, settings: Settings, metrics: Metrics, name: str
) -> MicroBatcher:
    batcher = MicroBatcher.for_runtime(
        runtime,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_size=settings.max_batch_size,
        max_wait_ms=settings.max_wait_ms,
        max_queue=settings.max_queue,
        on_batch=metrics.batch_observer(name),
    )
    metrics.watch_queue(name, lambda: batcher.depth)
    return batcher


async def load_engines(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    common = {
        "backend": settings.backend,
        "device": settings.device,
        "threads": settings.threads,
        "onnx_cache": settings.onnx_cache,
    }
    try:
        engines.encoder = await run_in_threadpool(
            load_encoder,
            settings.model or None,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            **common,
        )
        engines.embed_batcher = _batcher(engines.encoder, settings, metrics, "embed")
    except Exception as exc:
        engines.load_error = f"embedding model failed to load: {exc}"
        log.exception("embedding model failed to load")
        return
    try:
        engines.fill_mask = await run_in_threadpool(
            load_fill_mask, settings.fill_mask_model or None, **common
        )
        engines.fill_mask_batcher = _batcher(engines.fill_mask, settings, metrics, "fill-mask")
    except Exception as exc:  # the service still embeds and searches without a fill-mask model
        engines.fill_mask_error = f"fill-mask unavailable: {exc}"
        log.warning(engines.fill_mask_error)
    await _open_index(engines, settings, metrics)  # last: ready means every model has been tried


async def _open_index(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    # The service searches one query per request; concurrency comes from requests. OpenMP threads on a
    # single-query search only add synchronisation (docs/benchmarks.md, "Design measurements").
    faiss.omp_set_num_threads(1)
    try:
        engines.index = await run_in_threadpool(
            SearchIndex.open,
            settings.index,
            engines.encoder,
            create=True,
            read_only=settings.index_read_only,
            on_repair=metrics.count_repair,
        )
    except Exception as exc:
        if engines.index_error is None:  # retried every few seconds: log the first failure in full
            log.exception("index failed to open")
        engines.index_error = f"index at {settings.index} failed to open: {exc}"
        return
    for unit in ("documents", "chunks", "vectors"):
        metrics.index_size.labels(unit).set_function(lambda unit=unit: engines.index.stats()[unit])


async def follow_published_index(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    """Replicas (and this process after `cloze index build`) switch to a newly published version;
    an index that failed to open (e.g. a volume the indexer has not filled yet) is retried."""
    while True:
        await asyncio.sleep(RELOAD_EVERY_S)
        if engines.index is None and engines.encoder is not None and engines.index_error:
            await _open_index(engines, settings, metrics)
            if engines.index is not None:
                engines.index_error = None
                log.info("index opened after an earlier failure")
        elif engines.index is not None:
            try:
                if await run_in_threadpool(engines.index.reload_if_changed):
                    log.info("switched to a newly published index version")
            except Exception:
                log.exception("index reload failed; still serving the previous version")


async def close_engines(engines: Engines) -> None:
    for batcher in (engines.embed_batcher, engines.fill_mask_batcher):
        if batcher is not None:
            await batcher.stop()
    engines.search_pool.shutdown(wait=True)  # in-flight searches end before the index closes
    if engines.index is not None:
        engines.index.close()
