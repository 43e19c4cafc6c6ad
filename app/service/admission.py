"""Bounded executors: work that leaves the event loop waits in a queue of known size, and past it the
request is answered 429 with ``Retry-After`` at once (as the inference queues do), never queued without end."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.service.errors import ApiError


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
            return await loop.run_in_executor(self._pool, functools.partial(function, *args, **kwargs))
        finally:
            self.pending -= 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
