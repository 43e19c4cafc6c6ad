"""MicroBatcher: gathers concurrent requests into token-budgeted forward passes (TEI's dynamic batching).

Requests are tokenised off the event loop (together with whatever else arrived meanwhile), then queued.
Each inference thread, as soon as its last pass ends, takes one batch planned over the whole queue: the
oldest request and those nearest its length, within ``max_batch_tokens`` padded tokens. The queue is
bounded: past ``max_queue`` texts a request fails fast with ``Overloaded`` (HTTP 429).

Bulk work (the chunks of an upsert) shares the queue with queries but yields to them: it runs on all but one
of the inference threads (one, when there is only one), so a query never waits behind bulk passes on every
core, and while queries wait it gets at most one pass in ``bulk_share`` (at least that, so it is never
starved either). benchmarks/results/search_during_upsert.json measures search latency during a bulk load."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from encoder_runtime.tokenization import Encoded, plan_batches
from encoder_runtime.tokenized_runtime import TokenizedRuntime
from encoder_runtime.tracing import Attributes, past_span, recording

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


def oldest_pass(lengths: list[int], *budget) -> list[int]:
    """The positions one forward pass takes from a queue (oldest first): the oldest and the queued texts
    nearest its length, as ``plan_batches`` plans them all under ``budget`` (a bigger pool gives fuller,
    less padded batches; taking the oldest's bounds waits)."""
    return next(batch for batch in plan_batches(lengths, *budget) if 0 in batch)


class Overloaded(RuntimeError):
    def __init__(self, queued: int, limit: int, retry_after: float = 1.0):
        super().__init__(f"server busy: {queued} texts queued (limit {limit}); retry after {retry_after:g}s")
        self.retry_after = retry_after


@dataclass
class _Waiting:
    item: Encoded
    future: asyncio.Future
    bulk: bool = False
    # Set only for a request that is traced: when it was queued (ns), and the pass that answered it
    # (start and end in ns, texts, padded tokens), for its spans (``MicroBatcher._record_spans``).
    queued_ns: int = 0
    ran: tuple[int, int, int, int] | None = None


# Passes' worth of the oldest queued texts a pass is planned from (``MicroBatcher._window``).
WINDOW_PASSES = 4

BatchObserver = Callable[[int, int], None]  # (sequences, padded tokens) per forward pass


class MicroBatcher:
    def __init__(
        self,
        encode: Callable[[list[str]], list[Encoded]],
        run: Callable[[list[Encoded]], list[Any]],
        max_batch_tokens: int = 8192,
        max_batch_size: int = 64,
        max_wait_ms: float = 0.0,
        max_queue: int = 2048,
        on_batch: BatchObserver | None = None,
        parallel_passes: int = 1,
        max_padding: float = 0.1,
        padding_tokens: int = 0,
        inline_chars: int = 1000,
        bulk_share: int = 4,
        name: str = "batcher",
    ):
        self.name = name  # its spans' ``cloze.batcher`` (the service's /metrics label)
        self._encode, self._run = encode, run
        self.max_batch_tokens, self.max_batch_size = max_batch_tokens, max_batch_size
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.max_padding, self.padding_tokens = max_padding, padding_tokens
        # A request of at most this many characters is tokenised on the event loop: for a sentence the hop to
        # the tokenizer thread and back costs more than tokenising (docs/design-decisions.md). Longer requests
        # still go to the thread, so a big one does not stall the loop.
        self.inline_chars = inline_chars
        self._on_batch = on_batch
        self.bulk_share = max(1, bulk_share)
        self._passes_since_bulk = 0  # query passes taken while bulk work waited (guarded by ``_queue``)
        self.bulk_threads = max(1, parallel_passes - 1)
        self._bulk_running = 0  # bulk passes in flight (guarded by ``_queue``)
        self._admitted = 0  # texts accepted and not yet answered (the bound that makes 429s)
        self._tokenizers = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        self._to_tokenize: list[tuple[list[str], asyncio.Future]] = []
        self._tokenizing: asyncio.Task | None = None
        # As many inference threads as the backend runs passes well side by side (one per core on a CPU,
        # one on a GPU). Each plans its own next batch under this lock the moment its pass ends, so no core
        # waits a round trip through the event loop (docs/design-decisions.md).
        self.parallel_passes = parallel_passes
        self._queue = threading.Condition()
        # Queries and bulk texts queued, each oldest first, and their tokens (all guarded by ``_queue``).
        self._queries: deque[_Waiting] = deque()
        self._bulk: deque[_Waiting] = deque()
        self._queued_tokens = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def for_runtime(
        cls,
        runtime: TokenizedRuntime,
        max_batch_tokens: int | None = None,
        max_batch_size: int | None = None,
        **settings: Any,
    ) -> MicroBatcher:
        """A batcher over ``runtime``, shaped as its backend runs best (passes side by side, padding bound,
        and the backend's own budget of tokens and texts unless ``max_batch_tokens``/``max_batch_size`` set
        one)."""
        backend = runtime.backend
        return cls(
            runtime.encode,
            runtime.run,
            max_batch_tokens=max_batch_tokens or backend.batch_tokens,
            max_batch_size=max_batch_size or backend.batch_size,
            parallel_passes=backend.parallel_passes,
            max_padding=backend.max_padding,
            padding_tokens=backend.padding_tokens,
            **settings,
        )

    @property
    def depth(self) -> int:
        return self._admitted

    async def start(self) -> None:
        if self._threads:
            return
        self._loop = asyncio.get_running_loop()
        self._threads = [
            threading.Thread(target=self._infer, name=f"inference-{i}", daemon=True)
            for i in range(self.parallel_passes)
        ]
        for thread in self._threads:
            thread.start()

    async def stop(self) -> None:
        """Drain: answer everything admitted, then stop the inference threads."""
        while self._admitted:
            await asyncio.sleep(0.01)
        with self._queue:
            self._stopping = True
            self._queue.notify_all()
        for thread in self._threads:
            await asyncio.to_thread(thread.join)
        self._tokenizers.shutdown(wait=False)

    async def submit(
        self, texts: list[Any], cost: int | None = None, bulk: bool = False
    ) -> tuple[list[Encoded], list[Any]]:
        """Tokens and outputs for ``texts``, in order; raises ``Overloaded`` instead of queueing without end.

        ``cost`` is what the request counts against ``max_queue`` (default: one per text); fill-mask counts
        its mask tokens, which is what its memory and time follow. ``bulk`` texts yield to queries
        (``bulk_share``)."""
        cost = len(texts) if cost is None else cost
        if self._admitted + cost > self.max_queue:
            raise Overloaded(self._admitted, self.max_queue)
        await self.start()
        self._admitted += cost
        submitted = time.time_ns() if recording() else 0  # 0: not traced, and no clock read
        waiting: list[_Waiting] = []
        try:
            loop = asyncio.get_running_loop()
            if sum(map(len, texts)) <= self.inline_chars:
                items = self._encode(texts)
            else:
                items = await self._tokenized(loop, texts)
            queued = time.time_ns() if submitted else 0
            waiting = [_Waiting(item, loop.create_future(), bulk, queued) for item in items]
            with self._queue:
                (self._bulk if bulk else self._queries).extend(waiting)
                self._queued_tokens += sum(map(len, items))
                self._queue.notify()
            if len(waiting) == 1:
                return items, [await waiting[0].future]
            return items, list(await asyncio.gather(*(w.future for w in waiting)))
        finally:
            self._admitted -= cost
            if submitted:
                self._record_spans(submitted, waiting)

    def _record_spans(self, submitted: int, waiting: list[_Waiting]) -> None:
        """The request's tokenising, its wait in the queue (until its first text's pass began) and each forward
        pass that ran its texts (shared with other requests: ``cloze.batch.size`` says with how many texts)."""
        if not waiting:  # refused by the tokenizer
            return
        queued, name = waiting[0].queued_ns, self.name
        past_span(
            tracer,
            "batcher.tokenize",
            submitted,
            queued,
            {"cloze.batcher": name, "cloze.texts": len(waiting)},
        )
        passes = sorted({w.ran for w in waiting if w.ran is not None})
        if not passes:  # cancelled before any pass took it
            return
        past_span(tracer, "batcher.queue", queued, passes[0][0], {"cloze.batcher": name})
        for start, end, size, tokens in passes:
            attributes: Attributes = {
                "cloze.batcher": name,
                "cloze.batch.size": size,
                "cloze.batch.tokens": tokens,
            }
            past_span(tracer, "batcher.pass", start, end, attributes)

    async def _tokenized(self, loop: asyncio.AbstractEventLoop, texts: list[str]) -> list[Encoded]:
        """Long ``texts`` tokenised off the event loop, in one tokenizer call with whatever else arrived meanwhile:
        a thread hop per request costs more than the tokenising itself (docs/design-decisions.md)."""
        tokenized = loop.create_future()
        self._to_tokenize.append((texts, tokenized))
        if self._tokenizing is None or self._tokenizing.done():
            self._tokenizing = asyncio.create_task(self._tokenize_pending(loop))
        return await tokenized

    async def _tokenize_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._to_tokenize:
            pending, self._to_tokenize = self._to_tokenize, []
            texts = [text for request, _ in pending for text in request]
            try:
                items = await loop.run_in_executor(self._tokenizers, self._encode, texts)
            except Exception:  # a text the tokenizer refuses fails its own request, not its neighbours'
                await self._tokenize_one_by_one(loop, pending)
                continue
            start = 0
            for request, future in pending:
                if not future.done():
                    future.set_result(items[start : start + len(request)])
                start += len(request)

    async def _tokenize_one_by_one(self, loop: asyncio.AbstractEventLoop, pending: list) -> None:
        for request, future in pending:
            try:
                items = await loop.run_in_executor(self._tokenizers, self._encode, request)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(items)

    def _infer(self) -> None:
        """An inference thread: take a batch, run it, hand the answers to the event loop; until stopped."""
        while True:
            with self._queue:
                while not self._stopping and not self._can_take():
                    self._queue.wait()
                if self._stopping:
                    return
                self._fill()
                batch = self._take()
                bulk = bool(batch) and batch[0].bulk
                self._bulk_running += bulk
                if self._queries or self._bulk:
                    self._queue.notify()  # what this pass left behind is for a thread that is free
            if not batch:
                continue
            started = time.time_ns()  # two clock reads a pass, for the spans of traced requests
            outputs = self._outputs(batch)
            ran = (started, time.time_ns())
            if bulk:
                with self._queue:
                    self._bulk_running -= 1
                    self._queue.notify()  # a bulk slot is free again
            try:
                self._loop.call_soon_threadsafe(self._answer, batch, outputs, ran)
            except RuntimeError:  # the event loop has closed: no caller is left to answer
                return

    def _can_take(self) -> bool:
        """Lock held: a query waits, or bulk work waits and a bulk slot is free."""
        if self._bulk_running < self.bulk_threads:
            return bool(self._queries or self._bulk)
        return bool(self._queries)

    def _fill(self) -> None:
        """Wait up to ``max_wait`` for the budget to fill, so a burst shares a forward pass (lock held)."""
        deadline = time.monotonic() + self.max_wait
        while self._queued_tokens < self.max_batch_tokens and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._queue.wait(left)

    def _outputs(self, batch: list[_Waiting]) -> list[Any]:
        try:
            return self._run([w.item for w in batch])
        except Exception as exc:  # a failed forward pass fails its requests, not the thread
            log.exception("inference failed")
            return [exc] * len(batch)

    def _take(self) -> list[_Waiting]:
        """One forward pass over what is queued (``oldest_pass``): from the queries, or from the bulk texts
        when a bulk thread is free and no query waits (one pass in ``bulk_share`` while they do). Called with
        the lock held; a future cancelled meanwhile is read racily, and at worst runs once more."""
        bulk_free = bool(self._bulk) and self._bulk_running < self.bulk_threads
        if self._queries and (not bulk_free or self._passes_since_bulk < self.bulk_share - 1):
            self._passes_since_bulk += bulk_free
            group = self._queries
        elif bulk_free:
            self._passes_since_bulk = 0
            group = self._bulk
        else:  # only bulk waits, and its threads are busy
            return []
        window = self._window(group)
        if not window:
            return []
        chosen = oldest_pass(
            [len(w.item) for w in window],
            self.max_batch_tokens, self.max_batch_size, self.max_padding, self.padding_tokens,
        )  # fmt: skip
        taken = set(chosen)
        group.extendleft(reversed([w for i, w in enumerate(window) if i not in taken]))  # still oldest first
        batch = [window[i] for i in chosen]
        self._queued_tokens -= sum(len(w.item) for w in batch)
        return batch

    def _window(self, group: deque[_Waiting]) -> list[_Waiting]:
        """The oldest live texts of ``group`` a pass is planned from, taken off its head (lock held). Planning
        over the whole queue cost every pass time in proportion to the queue, under the lock and the GIL
        (15 ms a pass with 16,384 texts queued, docs/design-decisions.md); four passes' worth finds nearly as full a pass."""
        window: list[_Waiting] = []
        tokens, most_tokens = 0, WINDOW_PASSES * self.max_batch_tokens
        while group and len(window) < WINDOW_PASSES * self.max_batch_size and tokens < most_tokens:
            waiting = group.popleft()
            if waiting.future.cancelled():
                self._queued_tokens -= len(waiting.item)
            else:
                window.append(waiting)
                tokens += len(waiting.item)
        return window

    def _answer(self, batch: list[_Waiting], outputs: list[Any], ran: tuple[int, int]) -> None:
        """On the event loop: each caller gets its own output (or its pass's exception)."""
        padded = len(batch) * max(len(w.item) for w in batch)
        if self._on_batch:
            self._on_batch(len(batch), padded)
        for one, output in zip(batch, outputs, strict=True):
            if one.queued_ns:
                one.ran = (*ran, len(batch), padded)
            if one.future.done():
                continue
            if isinstance(output, Exception):
                one.future.set_exception(output)
            else:
                one.future.set_result(output)
