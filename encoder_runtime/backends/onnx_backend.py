"""ONNX Runtime backend, fp32 or int8, with the CUDA provider when it actually starts."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from encoder_runtime import devices
from encoder_runtime.backends.base import MASK_ROWS_PER_CHUNK, Task

log = logging.getLogger(__name__)


# ONNX Runtime's CPU SkipLayerNormalization kernel is slower than the Add + LayerNormalization it replaces
# (docs/design-decisions.md): the exported graphs leave them apart, and a CPU session must not fuse them
# again (on CUDA, not measured, the session fuses them as usual).
SLOW_CPU_FUSIONS = ["SkipLayerNormFusion"]


class OnnxBackend:
    def __init__(
        self,
        onnx_path: Path,
        task: Task,
        input_names: tuple[str, ...],
        device: str,
        int8: bool,
        threads: int = 0,
    ):
        import onnxruntime as ort

        self.name = "onnx-int8" if int8 else "onnx"
        self.onnx_path = onnx_path
        self.input_names = input_names
        requested, warning = devices.choose_onnx_providers(device, ort.get_available_providers())
        devices.warn(warning)
        cores = threads or os.cpu_count() or 1
        on_cpu = requested[0] == "CPUExecutionProvider"
        # On a CPU, one single-threaded pass per core beats one pass split over the cores: a small batch's pass
        # is many short operators, each a hand-off between threads (docs/design-decisions.md).
        self.parallel_passes = cores if on_cpu else 1
        self.max_padding = 0.02 if on_cpu else 0.1
        # A CPU pass has a fixed cost beyond its tokens, worth more than this much padding, so a batch may carry
        # it rather than split (docs/design-decisions.md); padding leaves vectors as they are (int8 scales are
        # calibrated: static_int8.py), and a reranker's scores likewise. Fill-mask positions cost more and CUDA
        # is not measured: no allowance.
        self.padding_tokens = 8 if on_cpu and task != "fill-mask" else 0
        # On a CPU a longer pass runs slower per token and grows the arena (docs/design-decisions.md); the CUDA
        # budget is the one the service always had (not measured on a GPU).
        self.batch_tokens = 512 if on_cpu else 8192
        self.batch_size = 64
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = 1 if on_cpu else cores
        options.inter_op_num_threads = 1
        # Spinning workers burn the cores the event loop and tokenisers need between forward passes
        # (docs/design-decisions.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(onnx_path),
            options,
            providers=requested,
            disabled_optimizers=SLOW_CPU_FUSIONS if on_cpu else None,
        )
        active = self.session.get_providers()
        devices.warn(devices.check_active_providers(requested, active))
        self.provider = active[0]
        log.info("%s backend: %s on %s", self.name, onnx_path.name, self.provider)

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feed = {name: inputs[name].astype(np.int64, copy=False) for name in self.input_names}
        return self.session.run(None, feed)[0]

    def mask_logits(self, inputs: dict[str, np.ndarray], where: np.ndarray) -> Iterator[np.ndarray]:
        """The exported graph gives logits at every position, so the batch runs a few rows at a time:
        each run holds at most ``MASK_ROWS_PER_CHUNK`` x width positions' logits (plus one row's)."""
        batch, width = inputs["input_ids"].shape
        rows_per_run = max(1, MASK_ROWS_PER_CHUNK // width)
        for first in range(0, batch, rows_per_run):
            last = min(batch, first + rows_per_run)
            picked = where[(where[:, 0] >= first) & (where[:, 0] < last)]
            if not len(picked):
                continue
            logits = self({name: value[first:last] for name, value in inputs.items()})
            yield logits[picked[:, 0] - first, picked[:, 1]]
