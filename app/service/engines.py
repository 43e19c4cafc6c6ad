"""What the routes need, loaded in the background so /healthz answers while models load."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from opentelemetry import trace
from starlette.concurrency import run_in_threadpool

from app.service.admission import BoundedPool
from app.service.collections import CollectionRegistry
from app.service.errors import ApiError
from app.service.lifecycle import Lifecycle
from app.service.metrics import Metrics
from app.service.model_registry import ModelRegistry, ModelSlot
from app.settings import DEFAULT_MODEL, Settings
from encoder_runtime import (
    EncoderRuntime,
    FillMaskRuntime,
    MicroBatcher,
    Overloaded,
    RerankerRuntime,
    RerankPair,
    load_encoder,
    load_fill_mask,
    load_reranker,
)
from encoder_runtime.tokenization import Encoded
from encoder_runtime.tracing import child_span

log = logging.getLogger("cloze.service")
tracer = trace.get_tracer(__name__)
DEFAULT_PENDING = 256


@dataclass
class Engines:
    # The collections, ``default`` (the service's own index, CLOZE_INDEX) first: the lifecycle adds each.
    collections: CollectionRegistry
    # Every named model's slot (runtime + batcher each), ``default`` first.
    models: ModelRegistry = field(default_factory=lambda: ModelRegistry("embedding"))
    fill_masks: ModelRegistry = field(default_factory=lambda: ModelRegistry("fill-mask"))
    rerankers: ModelRegistry = field(default_factory=lambda: ModelRegistry("rerank", bundled_default=False))
    load_attempts: int = 0
    load_failed: bool = False  # every attempt failed: this process will never become ready
    # Searches run here, first come first served, one per core: on anyio's 40-thread pool sixteen
    # concurrent searches share two cores and all finish late (c=16 p99 of hybrid /search: benchmarks/results/search_latency.json).
    search_pool: BoundedPool = field(
        default_factory=lambda: BoundedPool("search", os.cpu_count() or 1, DEFAULT_PENDING)
    )
    # Upserts chunk and commit here (they embed through the batcher) and serialise on the writer lock anyway.
    write_pool: BoundedPool = field(default_factory=lambda: BoundedPool("write", 2, DEFAULT_PENDING))
    # Short storage reads and fill-mask decoding: never the event loop, never anyio's unbounded queue.
    work_pool: BoundedPool = field(default_factory=lambda: BoundedPool("work", 4, DEFAULT_PENDING))

    def bound(self, max_pending: int) -> None:
        for pool in (self.search_pool, self.write_pool, self.work_pool):
            pool.max_pending = max_pending

    async def run_search(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self.search_pool.run(function, *args, **kwargs)

    @property
    def ready(self) -> bool:
        """The default embedding model serves and the collection ``default`` is open and reads."""
        return self.models.default.runtime is not None and self.collections.default.status == "ready"

    def require_encoder(self, model: str | None = None) -> tuple[EncoderRuntime, MicroBatcher]:
        """The embedding model ``model`` names (None: ``default``): 404/422 for a name it serves not, 503
        while it loads. The default model's 503 is as before named models: Retry-After until every attempt failed."""
        slot = self.models.find(model)
        if slot is self.models.default and (slot.runtime is None or slot.batcher is None):
            retry = None if self.load_failed else {"Retry-After": "2"}
            raise ApiError(503, slot.error or "model is loading", headers=retry)
        return self.models.loaded(slot)

    async def embed(
        self, texts: list[str], normalize: bool | None = True, bulk: bool = False, model: str | None = None
    ) -> tuple[list[Encoded], np.ndarray]:
        """The one way the service embeds (every route, the lane, upserts): the texts' tokens and finished
        float32 vectors (``normalize``: True / False, or None for the model's own choice), through the
        batcher of the embedding model ``model`` names (None: ``default``) and its admission queue: 429 with
        Retry-After when it is full, 503 while the model loads. ``bulk`` (upsert chunks) yields to queries
        (``CLOZE_BULK_SHARE``) and is sent in slices of at most a quarter of the queue, so an upsert with more
        chunks than the queue holds is still admitted."""
        encoder, batcher = self.require_encoder(model)
        with child_span(tracer, "embed", {"cloze.batcher": batcher.name, "cloze.texts": len(texts)}):
            if not bulk:
                items, vectors = await submit(batcher, texts)
                return items, encoder.finish(vectors, normalize=normalize)
            items, vectors, step = [], [], max(1, batcher.max_queue // 4)
            for start in range(0, len(texts), step):
                some_items, some_vectors = await submit(batcher, texts[start : start + step], bulk=True)
                items += some_items
                vectors += some_vectors
            return items, encoder.finish(vectors, normalize=normalize)

    def require_fill_mask(self, model: str | None = None) -> tuple[FillMaskRuntime, MicroBatcher]:
        return self.fill_masks.loaded(self.fill_masks.find(model))

    def require_reranker(
        self, model: str | None = None, field_name: str = "model"
    ) -> tuple[RerankerRuntime, MicroBatcher]:
        """The reranker ``model`` names (None: ``default`` if listed, else the first): 404 naming the served
        ones (or saying none is configured), 503 while it loads."""
        return self.rerankers.loaded(self.rerankers.find(model, field_name))

    @property
    def registries(self) -> tuple[ModelRegistry, ...]:
        return (self.models, self.fill_masks, self.rerankers)

    async def rerank(
        self, query: str, documents: list[str], model: str | None = None, field_name: str = "model"
    ) -> tuple[list[Encoded], np.ndarray]:
        """Each document's raw relevance logit for ``query`` (float32, in the documents' order) and the pairs'
        tokens, through the reranker's batcher and admission queue (a pair costs one place, as a text does
        for embeddings: 429 with Retry-After when full)."""
        _, batcher = self.require_reranker(model, field_name)
        with child_span(
            tracer, "rerank", {"cloze.batcher": batcher.name, "cloze.candidates": len(documents)}
        ):
            items, logits = await submit(batcher, [RerankPair(query, document) for document in documents])
        return items, np.asarray(logits, dtype=np.float32).reshape(len(documents))


async def submit(
    batcher: MicroBatcher, texts: list, cost: int | None = None, bulk: bool = False
) -> tuple[list, list]:
    """The batcher's answer, or 429 with Retry-After when its queue is full."""
    try:
        return await batcher.submit(texts, cost, bulk)
    except Overloaded as exc:
        raise ApiError(429, str(exc), headers={"Retry-After": str(max(1, round(exc.retry_after)))}) from exc


def _batcher(
    runtime: EncoderRuntime | FillMaskRuntime | RerankerRuntime,
    settings: Settings,
    metrics: Metrics,
    name: str,
    max_queue: int,
) -> MicroBatcher:
    batcher = MicroBatcher.for_runtime(
        runtime,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_size=settings.max_batch_size,
        max_wait_ms=settings.max_wait_ms,
        max_queue=max_queue,
        on_batch=metrics.batch_observer(name),
        bulk_share=settings.bulk_share,
        name=name,
    )
    metrics.watch_queue(name, lambda: batcher.depth)
    return batcher


def model_registries(settings: Settings) -> tuple[ModelRegistry, ModelRegistry, ModelRegistry]:
    """The embedding, fill-mask and rerank models the settings name, none loaded yet."""
    return (
        ModelRegistry.from_sources("embedding", settings.embedding_model_sources()),
        ModelRegistry.from_sources("fill-mask", settings.fill_mask_model_sources()),
        ModelRegistry.from_sources("rerank", settings.rerank_model_sources(), bundled_default=False),
    )


async def load_engines(engines: Engines, lifecycle: Lifecycle, settings: Settings, metrics: Metrics) -> None:
    """Load what is missing, retrying a failed load with backoff (a model folder on a volume that is
    still mounting, a transient disk error); after ``model_load_attempts`` failures of the default embedding
    model the process reports itself failed on /healthz, so an orchestrator replaces it. Another model that
    fails makes only its own routes answer 503. Then the collections open (``lifecycle.start``)."""
    delay = 1.0
    while True:
        engines.load_attempts += 1
        await _load_models(engines, settings, metrics)
        if engines.models.default.runtime is not None:
            break
        if engines.load_attempts >= settings.model_load_attempts:
            engines.load_failed = True
            log.error("giving up after %d attempts: %s", engines.load_attempts, engines.models.default.error)
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 30.0)
    await lifecycle.start()  # last: ready means every model has been tried
    await retry_other_models(engines, settings, metrics)


def _load_runtime(
    task: str, source: str, settings: Settings
) -> EncoderRuntime | FillMaskRuntime | RerankerRuntime:
    common: dict[str, Any] = {
        "backend": settings.backend,
        "device": settings.device,
        "threads": settings.threads,
        "onnx_cache": settings.onnx_cache,
    }
    if task == "fill-mask":
        return load_fill_mask(source or None, **common)
    if task == "rerank":
        return load_reranker(
            source,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_size=settings.max_batch_size,
            **common,
        )
    return load_encoder(
        source or None,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_size=settings.max_batch_size,
        **common,
    )


def batcher_label(task: str, name: str) -> str:
    """The ``batcher`` label of /metrics: ``embed`` and ``fill-mask`` for the defaults (as before named
    models), ``embed:legal`` for another, ``rerank:<name>`` for every reranker."""
    if task == "rerank":
        return f"rerank:{name}"
    base = "fill-mask" if task == "fill-mask" else "embed"
    return base if name == DEFAULT_MODEL else f"{base}:{name}"


async def _load_slot(
    registry: ModelRegistry, slot: ModelSlot, settings: Settings, metrics: Metrics
) -> Exception | None:
    """Load one model and give it its own batcher; the failure, if it failed."""
    try:
        runtime = await run_in_threadpool(_load_runtime, registry.task, slot.source, settings)
    except Exception as exc:
        return exc
    queue = settings.fill_mask_max_queue if registry.task == "fill-mask" else settings.max_queue
    slot.batcher = _batcher(runtime, settings, metrics, batcher_label(registry.task, slot.name), queue)
    slot.runtime, slot.error = runtime, None
    log.info("%s model %r loaded from %s", registry.task, slot.name, runtime.info.path)
    return None


async def _load_models(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    if engines.models.default.runtime is None:
        failure = await _load_slot(engines.models, engines.models.default, settings, metrics)
        if failure is not None:
            engines.models.default.error = (
                f"embedding model failed to load (attempt {engines.load_attempts} of "
                f"{settings.model_load_attempts}): {failure}"
            )
            log.error("embedding model failed to load", exc_info=failure)
            return
    if engines.load_attempts > settings.model_load_attempts:
        return
    for registry in engines.registries:
        for slot in registry.slots.values():
            if slot.runtime is None and slot is not engines.models.default:
                await _load_other(registry, slot, settings, metrics)


async def _load_other(registry: ModelRegistry, slot: ModelSlot, settings: Settings, metrics: Metrics) -> None:
    """A model besides the default embedding one: the service serves everything else without it."""
    failure = await _load_slot(registry, slot, settings, metrics)
    if failure is not None:
        if registry.task == "fill-mask" and slot.name == DEFAULT_MODEL:
            slot.error = f"fill-mask unavailable: {failure}"
        else:
            slot.error = f"{registry.task} model {slot.name!r} unavailable: {failure}"
        log.warning(slot.error)


def _missing_models(engines: Engines) -> list[ModelSlot]:
    return [
        slot for registry in engines.registries for slot in registry.slots.values() if slot.runtime is None
    ]


async def retry_other_models(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    """Models that failed to load (with the default embedding model up) are tried again a few times."""
    delay = 2.0
    for _ in range(settings.model_load_attempts - 1):
        if not _missing_models(engines) or engines.load_failed:
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 30.0)
        if engines.models.default.runtime is not None:
            await _load_models(engines, settings, metrics)


async def close_engines(engines: Engines, lifecycle: Lifecycle) -> None:
    for registry in engines.registries:
        for slot in registry.slots.values():
            if slot.batcher is not None:
                await slot.batcher.stop()
    for pool in (engines.search_pool, engines.write_pool, engines.work_pool):
        pool.shutdown()  # in-flight searches and writes end before the indexes close
    await lifecycle.close_all()
