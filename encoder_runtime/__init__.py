"""The inference runtime, the layer every stage stands on: model folders, torch / ONNX Runtime backends,
embedding and fill-mask runtimes, the micro-batcher. Imports no first-party package and no web framework."""

from encoder_runtime.batcher import MicroBatcher, Overloaded
from encoder_runtime.encoder import EncoderRuntime, load_encoder
from encoder_runtime.fill_mask import (
    FillMaskResult,
    FillMaskRuntime,
    NoMaskToken,
    load_fill_mask,
    pipeline_output,
)
from encoder_runtime.model_dir import ModelInfo, resolve_model_path

__all__ = [
    "EncoderRuntime",
    "FillMaskResult",
    "FillMaskRuntime",
    "MicroBatcher",
    "ModelInfo",
    "NoMaskToken",
    "Overloaded",
    "load_encoder",
    "load_fill_mask",
    "pipeline_output",
    "resolve_model_path",
]
