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
    batch_size: int
    padding_tokens: int  # padding a pass may carry whatever its fraction (``plan_batches``)


def pass_layout(kind: str, threads: int = 0) -> PassLayout:
    """On a CPU, as for ONNX Runtime: one single-threaded pass per core. A pass split over the cores stalls
    whenever the event loop or the tokeniser takes one of them (benchmarks/results/embed_throughput.json,
    torch rows; the split-pass figures are in docs/benchmarks.md). A CPU pass of 1,024 padded tokens embeds
    SciFact documents 12% faster than one of 8,192 with 45% of the memory; 512 was 8% slower
    (docs/design-decisions.md). A GPU takes one pass at a time, and a pass costs it about its kernel launches
    whatever its tokens (on an H100 four times the passes of a quarter the tokens ran 1.7x slower): so its
    passes take as many texts as the budget holds, padded up to half of it, rather than the CPU's 64 texts
    in length buckets (``../shared/measurements/gpu-h100-2026-12-05.json``)."""
    if kind == "cpu":
        return PassLayout(threads or os.cpu_count() or 1, 1, 1024, 64, 0)
    return PassLayout(1, None, 8192, 1024, 4096)


def layout_kind(device: torch.device) -> str:
    """The device's own layout, unless ``CLOZE_TORCH_PASSES`` names another (``cpu`` or ``cuda``)."""
    kind = os.environ.get(LAYOUT_VARIABLE, "").strip() or device.type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"{LAYOUT_VARIABLE}={kind!r}: expected 'cpu' or 'cuda'")
    return kind


class TorchBackend:
    name = "torch"
    max_padding = 0.1

    def __init__(self, path: Path, task: Task, input_names: tuple[str, ...], device: str, threads: int = 0):
        self.device = torch.device(device)
        self.layout = pass_layout(layout_kind(self.device), threads)
        self.parallel_passes = self.layout.parallel_passes
        # A GPU's passes leave the host's intra-op threads idle; the GPU's layout run on a CPU keeps its passes
        # single-threaded, or its threads' spin-waits, not the host's work, are what gets measured (thin
        # stand-in model, 2 busy cores: 2.7 ms of CPU a text on torch's threads against 0.1 ms on one).
        self._threads_per_pass = 1 if self.device.type == "cpu" else self.layout.threads_per_pass
        self.batch_tokens = self.layout.batch_tokens
        self.batch_size = self.layout.batch_size
        self.padding_tokens = self.layout.padding_tokens
        # Inputs from pinned host memory without blocking, outputs back the same way and waited for on an
        # event that sleeps: a pageable copy blocks, and CUDA's default wait spins a core for each pass.
        self._pinned = pinned_copies(self.device)
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
        if not self._pinned:
            return [torch.from_numpy(inputs[name]).to(self.device) for name in self.input_names]
        return [
            torch.from_numpy(inputs[name]).pin_memory().to(self.device, non_blocking=True)
            for name in self.input_names
        ]

    def _host(self, tensor: torch.Tensor) -> np.ndarray:
        """``tensor`` as float32 numpy on the host."""
        tensor = tensor.float()
        if not self._pinned:
            return tensor.cpu().numpy()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        done = torch.cuda.Event(blocking=True)  # a waiting thread sleeps instead of spinning
        done.record()
        done.synchronize()
        return host.numpy()

    @torch.inference_mode()
    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with _intra_op_threads(self._threads_per_pass):
            return self._host(self.module(*self._tensors(inputs)))

    @torch.inference_mode()
    def pooled(self, inputs: dict[str, np.ndarray], mode: str) -> np.ndarray:
        """Embeddings pooled on the device: a pass sends back [b, d] instead of its token states [b, t, d]
        (12.6 MB at 8,192 tokens, and the pooling that followed on the host)."""
        with _intra_op_threads(self._threads_per_pass):
            tensors = self._tensors(inputs)
            states = self.module(*tensors).float()
            mask = tensors[self.input_names.index("attention_mask")]
            return self._host(pool_states(states, mask, mode))

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
                yield self._host(head(part) if head is not None else part)


def pinned_copies(device: torch.device) -> bool:
    """Pinned, non-blocking copies wherever the passes run on CUDA (the host has no copy to make on a CPU)."""
    return device.type == "cuda" and torch.cuda.is_available()


def pool_states(states: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """``encoder.pool`` in torch: [b, t, d] token states -> [b, d]."""
    if mode == "cls":
        return states[:, 0]
    weights = mask.unsqueeze(-1).to(states.dtype)
    if mode == "max":
        return states.masked_fill(weights == 0, float("-inf")).amax(dim=1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


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
