"""The one small protocol every inference backend speaks."""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np

Task = Literal["embed", "fill-mask"]
BackendName = Literal["torch", "onnx", "onnx-int8"]


class Backend(Protocol):
    """Runs one padded batch. ``embed`` returns token states [b, t, d]; ``fill-mask`` returns logits [b, t, V]."""

    name: BackendName
    provider: str  # what actually runs: "cpu", "cuda", "CPUExecutionProvider", ...
    input_names: tuple[str, ...]

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray: ...
