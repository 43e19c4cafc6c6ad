"""PyTorch backend: CPU fp32, or CUDA with fp16 weights."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from encoder_runtime.backends.base import MASK_ROWS_PER_CHUNK, Task
from encoder_runtime.backends.modules import load_module, masked_lm_parts

log = logging.getLogger(__name__)

# Which device's pass layout to use, whatever the device: ``cuda`` runs the GPU's layout on a CPU, so the
# service's path to a GPU pass can be profiled on a machine without one (benchmarks/http_throughput.py).
LAYOUT_VARIABLE = "CLOZE_TORCH_PASSES"


@dataclass(frozen=True)
class PassLayout:
    """How passes run on a device: side by side or one at a time, and their budget."""

    parallel_passes: int
    threads_per_pass: int | None  # None: torch's own intra-op threads
    batch_tokens: int


def pass_layout(kind: str, threads: int = 0) -> PassLayout:
    """On a CPU, as for ONNX Runtime: one single-threaded pass per core. A pass split over the cores stalls
    whenever the event loop or the tokeniser takes one of them (benchmarks/results/embed_throughput.json,
    torch rows; the split-pass figures are in docs/benchmarks.md). A CPU pass of 1,024 padded tokens embeds
    SciFact documents 12% faster than one of 8,192 with 45% of the memory; 512 was 8% slower
    (docs/design-decisions.md). A GPU takes one pass at a time."""
    if kind == "cpu":
        return PassLayout(threads or os.cpu_count() or 1, 1, 1024)
    return PassLayout(1, None, 8192)


def layout_kind(device: torch.device) -> str:
    """The device's own layout, unless ``CLOZE_TORCH_PASSES`` names another (``cpu`` or ``cuda``)."""
    kind = os.environ.get(LAYOUT_VARIABLE, "").strip() or device.type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"{LAYOUT_VARIABLE}={kind!r}: expected 'cpu' or 'cuda'")
    return kind


class TorchBackend:
    name = "torch"
    max_padding = 0.1
    padding_tokens = 0  # a pass's fixed cost is not measured for torch (docs/design-decisions.md)

    def __init__(self, path: Path, task: Task, input_names: tuple[str, ...], device: str, threads: int = 0):
        self.device = torch.device(device)
        self.layout = pass_layout(layout_kind(self.device), threads)
        self.parallel_passes = self.layout.parallel_passes
        self._threads_per_pass = self.layout.threads_per_pass
        self.batch_tokens = self.layout.batch_tokens
        self.input_names = input_names
        module = load_module(path, task, input_names).to(self.device)
        if self.device.type == "cuda":
            module = module.half()  # fp16 on GPU: twice the throughput, cosine to fp32 > 0.9999
        self.module = module
        # Fill-mask: the encoder and the MLM head apart, so the head runs only at mask positions.
        self._mlm = masked_lm_parts(module.model) if task == "fill-mask" else None
        self.provider = f"{self.device.type}{' fp16' if self.device.type == 'cuda' else ''}"
        log.info("torch backend on %s", self.provider)

    def _tensors(self, inputs: dict[str, np.ndarray]) -> list[torch.Tensor]:
        return [torch.from_numpy(inputs[name]).to(self.device) for name in self.input_names]

    @torch.inference_mode()
    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with _intra_op_threads(self._threads_per_pass):
            return self.module(*self._tensors(inputs)).float().cpu().numpy()

    @torch.inference_mode()
    def mask_logits(self, inputs: dict[str, np.ndarray], where: np.ndarray) -> Iterator[np.ndarray]:
        rows = torch.from_numpy(where[:, 0]).to(self.device)
        cols = torch.from_numpy(where[:, 1]).to(self.device)
        with _intra_op_threads(self._threads_per_pass):
            tensors = self._tensors(inputs)
            if self._mlm is None:  # a head we don't know how to split: full logits, then the mask rows
                hidden, head = self.module(*tensors)[rows, cols], None
            else:
                encoder, head = self._mlm
                states = encoder(**dict(zip(self.input_names, tensors, strict=True)))[0]
                hidden = states[rows, cols]
            for start in range(0, hidden.shape[0], MASK_ROWS_PER_CHUNK):
                part = hidden[start : start + MASK_ROWS_PER_CHUNK]
                yield (head(part) if head is not None else part).float().cpu().numpy()


@contextmanager
def _intra_op_threads(threads: int | None):
    """Run with ``threads`` OpenMP threads on this thread only (torch's setting is per calling thread)."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
