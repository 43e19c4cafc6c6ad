"""The part every runtime (embedding, fill-mask, rerank) shares: a tokenizer, a backend, and passes run side
by side."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from encoder_runtime.backends.base import Backend
from encoder_runtime.model_dir import ModelInfo
from encoder_runtime.tokenization import Encoded, TextTokenizer


class TokenizedRuntime:
    """What every runtime offers the micro-batcher: texts -> ``Encoded`` items within ``max_tokens``."""

    task = "forward"  # also names its pass threads
    tokenizer: TextTokenizer
    backend: Backend
    # Threads for ``backend.parallel_passes`` passes side by side (None: one pass at a time); the executor
    # starts its threads only when first used.
    _passes: ThreadPoolExecutor | None = None
    # Offline passes' limits (``plan_batches``): what the runtimes that plan their own batches set.
    max_batch_tokens: int
    max_batch_size: int

    def __init__(
        self,
        info: ModelInfo,
        tokenizer: TextTokenizer,
        backend: Backend,
        max_batch_tokens: int | None = None,
        max_batch_size: int | None = None,
    ):
        """A runtime that plans its own passes: ``max_batch_tokens`` None is what the backend runs best. It
        runs one probe pass (``probe``) before it is handed out, so a model that cannot serve fails at load."""
        self.info = info
        self.tokenizer = tokenizer
        self.backend = backend
        self.max_batch_tokens = max_batch_tokens or backend.batch_tokens
        self.max_batch_size = max_batch_size or backend.batch_size
        if backend.parallel_passes > 1:
            self._passes = ThreadPoolExecutor(backend.parallel_passes, thread_name_prefix=self.task)
        self.probe()

    def probe(self) -> None:
        """What a runtime learns from (or checks with) one pass at load."""

    @property
    def batch_budget(self) -> tuple[int, int, float, int]:
        """``plan_batches``' limits as this runtime plans its passes: tokens, size, padding bound, allowance."""
        return (
            self.max_batch_tokens,
            self.max_batch_size,
            self.backend.max_padding,
            self.backend.padding_tokens,
        )

    def run_batches(self, items: list[Encoded], batches: list[list[int]]) -> list[Any]:
        """``run`` over each batch of indices into ``items``, as many side by side as the backend runs
        well; one output per item, in ``items``' order."""

        def run(batch: list[int]) -> list[Any]:
            return self.run([items[i] for i in batch])

        if self._passes is not None and len(batches) > 1:
            results = list(self._passes.map(run, batches))
        else:
            results = [run(batch) for batch in batches]
        out: list[Any] = [None] * len(items)
        for batch, outputs in zip(batches, results, strict=True):
            for index, output in zip(batch, outputs, strict=True):
                out[index] = output
        return out

    def run(self, items: list[Encoded]) -> list[Any]:
        raise NotImplementedError

    @property
    def max_tokens(self) -> int:
        return self.tokenizer.max_tokens

    def encode(self, texts: list[str]) -> list[Encoded]:
        return self.tokenizer.encode(texts)
