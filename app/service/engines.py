"""What the routes need, loaded in the background so /healthz answers while models load."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from starlette.concurrency import run_in_threadpool

from app.service.admission import BoundedPool
from app.service.collections import Collection, CollectionRegistry
from app.service.errors import ApiError
from app.service.metrics import Metrics
from app.service.model_registry import INDEX_MODEL, ModelRegistry, ModelSlot
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
from index.collections import DEFAULT_COLLECTION, clean_leftovers, list_collections
from index.search_index import SearchIndex

log = logging.getLogger("cloze.service")
RELOAD_EVERY_S = 2.0
DEFAULT_PENDING = 256


class DefaultModelAttribute:
    """Engines' attributes from before named models and collections (``encoder``, ``embed_batcher``,
    ``fill_mask``, ``index``, ...): the ``default`` model's or collection's, so the code and tests that read
    or set them reach the default one."""

    def __init__(self, registry: str, attribute: str):
        self.registry, self.attribute = registry, attribute

    def __get__(self, engines: Engines | None, owner: type | None = None) -> Any:
        if engines is None:  # the dataclass asks the class for the field's default
            return None
        return getattr(getattr(engines, self.registry).default, self.attribute)

    def __set__(self, engines: Engines, value: Any) -> None:
        setattr(getattr(engines, self.registry).default, self.attribute, value)


@dataclass
class Engines:
    # Every named model's slot (runtime + batcher each), ``default`` first; declared before the attributes
    # below, which the generated __init__ sets through them.
    models: ModelRegistry = field(default_factory=lambda: ModelRegistry("embedding"))
    fill_masks: ModelRegistry = field(default_factory=lambda: ModelRegistry("fill-mask"))
    rerankers: ModelRegistry = field(default_factory=lambda: ModelRegistry("rerank", bundled_default=False))
    encoder: EncoderRuntime | None = DefaultModelAttribute("models", "runtime")  # type: ignore[assignment]
    embed_batcher: MicroBatcher | None = DefaultModelAttribute("models", "batcher")  # type: ignore[assignment]
    load_error: str | None = DefaultModelAttribute("models", "error")  # type: ignore[assignment]
    fill_mask: FillMaskRuntime | None = DefaultModelAttribute("fill_masks", "runtime")  # type: ignore[assignment]
    fill_mask_batcher: MicroBatcher | None = DefaultModelAttribute("fill_masks", "batcher")  # type: ignore[assignment]
    fill_mask_error: str | None = DefaultModelAttribute("fill_masks", "error")  # type: ignore[assignment]
    # The collections, ``default`` (the service's own index, CLOZE_INDEX) first; ``index`` and the other
    # attributes below are the default collection's.
    collections: CollectionRegistry = field(
        default_factory=lambda: CollectionRegistry(
            Path("data/collections"), Collection(DEFAULT_COLLECTION, INDEX_MODEL, Path("data/index"))
        )
    )
    index: Any = DefaultModelAttribute("collections", "index")  # index.SearchIndex
    index_error: str | None = DefaultModelAttribute("collections", "error")  # type: ignore[assignment]
    load_attempts: int = 0
    load_failed: bool = False  # every attempt failed: this process will never become ready
    # CLOZE_INDEX_READ_ONLY: known before the index opens
    read_only: bool = DefaultModelAttribute("collections", "read_only")  # type: ignore[assignment]
    # Opened, but the last probe could not read it (index_error says why)
    index_failing: bool = DefaultModelAttribute("collections", "failing")  # type: ignore[assignment]
    stats: dict[str, int] = field(default_factory=dict)  # refreshed in the background, read by /metrics
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
        return self.encoder is not None and self.index is not None and not self.index_failing

    def require_encoder(self, model: str | None = None) -> tuple[EncoderRuntime, MicroBatcher]:
        """The embedding model ``model`` names (None: ``default``): 404/422 for a name it serves not, 503
        while it loads. The default model's 503 is as before named models: Retry-After until every attempt failed."""
        slot = self.models.find(model)
        if slot is self.models.default and (self.encoder is None or self.embed_batcher is None):
            retry = None if self.load_failed else {"Retry-After": "2"}
            raise ApiError(503, self.load_error or "model is loading", headers=retry)
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
        items, logits = await submit(batcher, [RerankPair(query, document) for document in documents])
        return items, np.asarray(logits, dtype=np.float32).reshape(len(documents))

    @property
    def index_encoder(self) -> EncoderRuntime | None:
        """The runtime of the model the index's vectors come from (``INDEX_MODEL``)."""
        return self.models.slots[INDEX_MODEL].runtime

    def require_index(self) -> Any:
        """The default collection's index (503 while it opens)."""
        return self.collections.default.require_index()


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


async def load_engines(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    """Load what is missing, retrying a failed load with backoff (a model folder on a volume that is
    still mounting, a transient disk error); after ``model_load_attempts`` failures of the default embedding
    model the process reports itself failed on /healthz, so an orchestrator replaces it. Another model that
    fails makes only its own routes answer 503."""
    delay = 1.0
    while True:
        engines.load_attempts += 1
        await _load_models(engines, settings, metrics)
        if engines.encoder is not None:
            break
        if engines.load_attempts >= settings.model_load_attempts:
            engines.load_failed = True
            log.error("giving up after %d attempts: %s", engines.load_attempts, engines.load_error)
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 30.0)
    await _open_index(engines, settings, metrics)  # last: ready means every model has been tried
    if not settings.index_read_only:  # a killed create or delete: the writer cleans what it left
        await run_in_threadpool(clean_leftovers, engines.collections.root)
    await sync_collections(engines, settings, metrics)
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
    if engines.encoder is None:
        failure = await _load_slot(engines.models, engines.models.default, settings, metrics)
        if failure is not None:
            engines.load_error = (
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
        if engines.encoder is not None:
            await _load_models(engines, settings, metrics)


async def _open_index(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    # The service searches one query per request; concurrency comes from requests. OpenMP threads on a
    # single-query search only add synchronisation (docs/benchmarks.md, "Design measurements").
    faiss.omp_set_num_threads(1)
    try:
        engines.index = await run_in_threadpool(
            SearchIndex.open,
            settings.index,
            engines.index_encoder,
            create=True,
            read_only=settings.index_read_only,
            on_repair=metrics.count_repair,
        )
    except Exception as exc:
        if engines.index_error is None:  # retried every few seconds: log the first failure in full
            log.exception("index failed to open")
        engines.index_error = f"index at {settings.index} failed to open: {exc}"
        return
    await refresh_stats(engines)
    # /metrics reads the figures the follower refreshes every few seconds: a scrape never counts rows.
    for unit in ("documents", "chunks", "vectors"):
        metrics.index_size.labels(unit).set_function(lambda unit=unit: engines.stats.get(unit, 0))


async def sync_collections(engines: Engines, settings: Settings, metrics: Metrics) -> None:
    """Serve the collections on disk: open the new ones (and those that failed to open), drop those whose
    folder went (deleted by another process), and follow every open one's published versions."""
    registry = engines.collections
    async with registry.lifecycle:
        on_disk = {info.name: info for info in await run_in_threadpool(list_collections, registry.root)}
        for gone in [c for c in registry.others() if c.name not in on_disk]:
            registry.collections.pop(gone.name, None)
            log.info("collection %r went from disk: no longer served", gone.name)
            await run_in_threadpool(close_collection, gone)
        for name, info in on_disk.items():
            if name not in registry.collections:
                registry.collections[name] = Collection(
                    name, info.model, registry.root / name, info, read_only=settings.index_read_only
                )
            if registry.collections[name].index is None:
                await open_collection(engines, registry.collections[name], settings, metrics)
    for collection in registry.others():
        if collection.index is not None:
            try:
                await run_in_threadpool(collection.index.reload_if_changed)
            except Exception:
                log.exception(
                    "collection %r: reload failed; still serving its previous version", collection.name
                )


async def open_collection(
    engines: Engines, collection: Collection, settings: Settings, metrics: Metrics
) -> None:
    """Open a collection's index with its model's runtime (or, for the caller's own vectors, what stands for
    one); on failure its routes answer 503 saying why."""
    encoder = collection.info.own_vectors() if collection.info is not None else None
    slot = engines.models.slots.get(collection.model) if encoder is None else None
    if encoder is None and (slot is None or slot.runtime is None):
        why = "is not served here" if slot is None else slot.error or "is loading"
        collection.error = f"collection {collection.name!r}: its model {collection.model!r} {why} ({engines.models.served()})"
        return
    try:
        collection.index = await run_in_threadpool(
            SearchIndex.open,
            collection.path,
            encoder or slot.runtime,  # type: ignore[union-attr]
            create=False,
            read_only=collection.read_only,
            on_repair=metrics.count_repair,
        )
    except Exception as exc:
        message = f"collection {collection.name!r} failed to open: {exc}"
        if collection.error != message:  # retried every few seconds: log each new failure once
            log.error(message)
        collection.error = message
        return
    collection.error = None


def close_collection(collection: Collection) -> None:
    index, collection.index = collection.index, None
    if index is not None:
        index.close()


async def refresh_stats(engines: Engines) -> None:
    if engines.index is not None:
        try:
            engines.stats = await run_in_threadpool(engines.index.stats)
        except Exception:  # a version swapped under the count: the next round gets it
            log.debug("index stats not refreshed", exc_info=True)


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
            await probe_index(engines, settings)
            await refresh_stats(engines)
        if engines.encoder is not None:
            await sync_collections(engines, settings, metrics)


async def probe_index(engines: Engines, settings: Settings) -> None:
    """/readyz must not say ready while searches fail (issue 42: a replica answered 500 to every filtered
    search and was ready): each round reads the index as a search does, and readiness follows the result."""
    try:
        await run_in_threadpool(engines.index.probe)
    except Exception as exc:
        if not engines.index_failing:
            log.exception("the index cannot be read: not ready until it can")
        engines.index_error = f"index at {settings.index} cannot be read: {exc}"
        engines.index_failing = True
        return
    if engines.index_failing:
        log.info("the index reads again: ready")
        engines.index_failing, engines.index_error = False, None


async def close_engines(engines: Engines) -> None:
    for registry in engines.registries:
        for slot in registry.slots.values():
            if slot.batcher is not None:
                await slot.batcher.stop()
    for pool in (engines.search_pool, engines.write_pool, engines.work_pool):
        pool.shutdown()  # in-flight searches and writes end before the index closes
    for collection in engines.collections.collections.values():
        close_collection(collection)
