"""MicroBatcher: gathers concurrent requests into token-budgeted forward passes (TEI's dynamic batching).

Requests are tokenised off the event loop, queued, and taken in arrival order up to ``max_batch_tokens``
real tokens; each taken group is sorted by length and split into padded batches within the same budget.
The queue is bounded: past ``max_queue`` texts a request fails fast with ``Overloaded`` (HTTP 429).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from app.runtime.tokenization import Encoded, plan_batches

log = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    def __init__(self, queued: int, limit: int, retry_after: float = 1.0):
        super().__init__(f"server busy: {queued} texts queued (limit {limit}); retry after {retry_after:g}s")
        self.retry_after = retry_after


@dataclass
class _Waiting:
    item: Encoded
    future: asyncio.Future


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
    ):
        self._encode, self._run = encode, run
        self.max_batch_tokens, self.max_batch_size = max_batch_tokens, max_batch_size
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self._on_batch = on_batch
        self._waiting: deque[_Waiting] = deque()
        self._admitted = 0  # texts accepted and not yet answered (the bound that makes 429s)
        self._wakeup = asyncio.Event()
        self._tokenizers = ThreadPoolExecutor(2, thread_name_prefix="tokenize")
        # As many forward passes in flight as the backend runs well side by side (one per core for ONNX
        # Runtime on a CPU, else one that owns every core); each takes what gathered while all were busy.
        self.parallel_passes = parallel_passes
        self._inference = ThreadPoolExecutor(parallel_passes, thread_name_prefix="inference")
        self._in_flight: set[asyncio.Task] = set()
        self._worker: asyncio.Task | None = None

    @property
    def depth(self) -> int:
        return self._admitted

    async def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._serve(), name="micro-batcher")

    async def stop(self) -> None:
        """Drain: answer everything admitted, then stop the worker."""
        while self._admitted:
            await asyncio.sleep(0.01)
        if self._worker:
            for task in (self._worker, *self._in_flight):
                task.cancel()
            await asyncio.gather(self._worker, *self._in_flight, return_exceptions=True)
            self._worker = None
        self._tokenizers.shutdown(wait=False)
        self._inference.shutdown(wait=True)

    async def submit(self, texts: list[str]) -> tuple[list[Encoded], list[Any]]:
        """Tokens and outputs for ``texts``, in order; raises ``Overloaded`` instead of queueing without end."""
        if self._admitted + len(texts) > self.max_queue:
            raise Overloaded(self._admitted, self.max_queue)
        await self.start()
        self._admitted += len(texts)
        try:
            loop = asyncio.get_running_loop()
            items = await loop.run_in_executor(self._tokenizers, self._encode, texts)
            futures = [loop.create_future() for _ in items]
            self._waiting.extend(_Waiting(item, future) for item, future in zip(items, futures, strict=True))
            self._wakeup.set()
            return items, list(await asyncio.gather(*futures))
        finally:
            self._admitted -= len(texts)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        free = asyncio.Semaphore(self.parallel_passes)
        while True:
            await self._wakeup.wait()
            await free.acquire()
            await self._fill(loop)
            group = self._take()
            if not self._waiting:
                self._wakeup.clear()
            if not group:
                free.release()
                continue
            task = asyncio.create_task(self._answer(loop, group))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            task.add_done_callback(lambda _: free.release())

    async def _fill(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait up to ``max_wait`` for the budget to fill, so a burst shares a forward pass."""
        deadline = loop.time() + self.max_wait
        while sum(len(w.item) for w in self._waiting) < self.max_batch_tokens and loop.time() < deadline:
            await asyncio.sleep(min(0.0005, max(deadline - loop.time(), 0)))

    def _take(self) -> list[_Waiting]:
        group: list[_Waiting] = []
        tokens = 0
        while self._waiting and (not group or tokens + len(self._waiting[0].item) <= self.max_batch_tokens):
            waiting = self._waiting.popleft()
            if not waiting.future.cancelled():
                group.append(waiting)
                tokens += len(waiting.item)
        return group

    async def _answer(self, loop: asyncio.AbstractEventLoop, group: list[_Waiting]) -> None:
        """Run ``group`` as length-sorted padded batches, answering each batch's callers as soon as it is
        done: they can send their next request while the rest of the group runs, so the backend never
        waits for a whole group's callers to come back."""
        lengths = [len(w.item) for w in group]
        for batch in plan_batches(lengths, self.max_batch_tokens, self.max_batch_size):
            waiting = [group[i] for i in batch]
            try:
                outputs = await loop.run_in_executor(self._inference, self._run, [w.item for w in waiting])
            except Exception as exc:  # a failed forward pass fails its requests, not the worker
                log.exception("inference failed")
                outputs = [exc] * len(waiting)
            if self._on_batch:
                self._on_batch(len(batch), len(batch) * max(lengths[i] for i in batch))
            for one, output in zip(waiting, outputs, strict=True):
                if one.future.done():
                    continue
                if isinstance(output, Exception):
                    one.future.set_exception(output)
                else:
                    one.future.set_result(output)
