"""The one small protocol every inference backend speaks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, Protocol

import numpy as np

Task = Literal["embed", "fill-mask", "rerank"]
BackendName = Literal["torch", "onnx", "onnx-int8"]


class Backend(Protocol):
    """Runs one padded batch. ``embed`` returns token states [b, t, d]; ``fill-mask`` returns logits [b, t, V];
    ``rerank`` (a cross-encoder) returns one logit per sequence [b, 1]."""

    name: BackendName
    provider: str  # what actually runs: "cpu", "cuda", "CPUExecutionProvider", ...
    input_names: tuple[str, ...]
    # Forward passes it runs well side by side: on a CPU one single-threaded pass per core (no thread
    # hand-offs inside a pass); a GPU takes one pass at a time.
    parallel_passes: int
    # Padding a batch may carry, as a fraction of its real tokens (``plan_batches``): single-threaded CPU
    # passes run short batches best (see there); one pass over many threads wants fuller batches.
    max_padding: float
    # What a forward pass costs beyond its tokens, in padded tokens: a batch may carry this much padding
    # whatever its fraction, because running those texts as another pass would cost more.
    padding_tokens: int
    # Padded tokens in one pass when the caller sets no budget (``max_batch_tokens``). On a CPU a longer
    # pass runs slower per token (its activations outgrow the cache), and ONNX Runtime's arena keeps what its
    # largest pass needed (docs/design-decisions.md). A GPU wants full passes.
    batch_tokens: int
    # Most sequences in one pass when the caller sets no limit (``max_batch_size``).
    batch_size: int

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray: ...

    def mask_logits(self, inputs: dict[str, np.ndarray], where: np.ndarray) -> Iterator[np.ndarray]:
        """Fill-mask: logits [n, V] at the (row, column) pairs of ``where`` ([N, 2]), in order, a bounded
        number of rows at a time (``MASK_ROWS_PER_CHUNK``), so memory follows masks, never positions."""
        ...


# Rows of [V]-wide logits held at once (256 x 30,522 floats = 31 MB for a BERT vocabulary).
MASK_ROWS_PER_CHUNK = 256
