"""Which device and which ONNX Runtime providers to use: pure decisions, so CI without a GPU can test them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


@dataclass(frozen=True)
class DeviceChoice:
    device: str  # "cpu" | "cuda"
    warning: str | None = None


def choose_device(requested: str, cuda_available: bool) -> DeviceChoice:
    """``auto`` takes CUDA when usable; an explicit ``cuda`` that is not usable falls back with a warning."""
    if requested == "cpu":
        return DeviceChoice("cpu")
    if cuda_available:
        return DeviceChoice("cuda")
    if requested == "cuda":
        return DeviceChoice("cpu", "CUDA was requested but is not usable here; running on CPU")
    return DeviceChoice("cpu")


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def choose_onnx_providers(device: str, available: list[str]) -> tuple[list[str], str | None]:
    """Providers to ask ONNX Runtime for, CPU always last as the fallback."""
    if device == "cuda" and CUDA_PROVIDER in available:
        return [CUDA_PROVIDER, CPU_PROVIDER], None
    if device == "cuda":
        return [CPU_PROVIDER], "CUDA was requested but onnxruntime has no CUDA provider; running on CPU"
    return [CPU_PROVIDER], None


def check_active_providers(requested: list[str], active: list[str]) -> str | None:
    """onnxruntime-gpu without CUDA libraries silently drops to CPU (``get_device()`` still says GPU).

    The session's own provider list is the truth; return a warning when CUDA was asked for and lost.
    """
    if CUDA_PROVIDER in requested and CUDA_PROVIDER not in active:
        return "onnxruntime could not start its CUDA provider (missing CUDA/cuDNN libraries?); running on CPU"
    return None


def warn(message: str | None) -> None:
    if message:
        log.warning(message)
