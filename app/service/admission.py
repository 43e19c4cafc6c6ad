"""Bounded executors: work that leaves the event loop waits in a queue of known size, and past it the
request is answered 429 with ``Retry-After`` at once (as the inference queues do), never queued without end."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry import trace

from app.service.errors import ApiError
from encoder_runtime.tracing import in_context, past_span, recording

tracer = trace.get_tracer(__name__)


class BoundedPool:
    """``threads`` workers; at most ``max_pending`` calls admitted (running or waiting) at a time."""

    def __init__(self, name: str, threads: int, max_pending: int):
        self.name, self.max_pending = name, max(max_pending, threads)
        self.pending = 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)

    async def run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.pending >= self.max_pending:
            raise ApiError(
                429,
                f"server busy: {self.pending} {self.name} requests in progress (limit {self.max_pending})",
                headers={"Retry-After": "1"},
            )
        self.pending += 1  # on the event loop only: no lock needed
        try:
            loop = asyncio.get_running_loop()
            call = functools.partial(function, *args, **kwargs)
            if recording():
                return await self._run_traced(loop, call)
            return await loop.run_in_executor(self._pool, call)
        finally:
            self.pending -= 1

    async def _run_traced(self, loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> Any:
        """``call`` under the caller's span in the worker thread, and its wait for a thread as a span: under
        load the wait for a free core is often most of a search's time."""
        queued, started = time.time_ns(), []

        def timed() -> Any:
            started.append(time.time_ns())
            return call()

        try:
            return await loop.run_in_executor(self._pool, in_context(timed))
        finally:
            if started:
                past_span(tracer, "pool.queue", queued, started[0], {"cloze.pool": self.name})

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
