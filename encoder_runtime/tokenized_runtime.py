"""The part every runtime (embedding, fill-mask) shares: a tokenizer, a backend, and passes run side by side."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from encoder_runtime.backends.base import Backend
from encoder_runtime.tokenization import Encoded, TextTokenizer


class TokenizedRuntime:
    """What every runtime offers the micro-batcher: texts -> ``Encoded`` items within ``max_tokens``."""

    tokenizer: TextTokenizer
    backend: Backend
    # Threads for ``backend.parallel_passes`` passes side by side (None: one pass at a time); the executor
    # starts its threads only when first used.
    _passes: ThreadPoolExecutor | None = None

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
