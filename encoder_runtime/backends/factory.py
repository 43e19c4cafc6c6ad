"""One factory for the backend family: resolves ``auto`` and the device, exports ONNX when needed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from encoder_runtime import devices
from encoder_runtime.backends.base import Backend, Task
from encoder_runtime.backends.onnx_backend import OnnxBackend
from encoder_runtime.backends.onnx_export import default_cache_dir, ensure_onnx


def onnxruntime_installed() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def resolve_backend_name(requested: str, task: Task, device: str, has_onnxruntime: bool) -> str:
    """``auto``: torch fp16 on a GPU; on CPU, int8 ONNX for embeddings and rerankers (the fastest CPU backend,
    cosine to fp32 >= 0.99: benchmarks/results/embed_throughput.json; a reranker's int8 is calibrated the same
    way) and torch for fill-mask, whose top tokens int8 can reorder. Without onnxruntime, torch."""
    if requested != "auto":
        if requested.startswith("onnx") and not has_onnxruntime:
            raise RuntimeError(
                f"backend {requested!r} needs onnxruntime: pip install 'cloze-search[cpu]' (or [gpu])"
            )
        return requested
    if device == "cuda" or task == "fill-mask" or not has_onnxruntime:
        return "torch"
    return "onnx-int8"


def create_backend(
    model_path: Path,
    task: Task,
    input_names: tuple[str, ...],
    backend: str = "auto",
    device: str = "auto",
    threads: int = 0,
    onnx_cache: Path | None = None,
) -> Backend:
    choice = devices.choose_device(device, devices.torch_cuda_available())
    devices.warn(choice.warning)
    name = resolve_backend_name(backend, task, choice.device, onnxruntime_installed())
    if name == "torch":
        from encoder_runtime.backends.torch_backend import TorchBackend  # torch: only this backend loads it

        return TorchBackend(model_path, task, input_names, choice.device, threads)
    int8 = name == "onnx-int8"
    cache = default_cache_dir(model_path, onnx_cache)
    onnx_path = ensure_onnx(model_path, task, int8, input_names, cache)
    return OnnxBackend(onnx_path, task, input_names, choice.device, int8, threads)
