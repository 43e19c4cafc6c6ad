"""The inference runtime, the layer every stage stands on: model folders, torch / ONNX Runtime backends,
embedding, fill-mask and rerank runtimes, the micro-batcher. Imports no first-party package and no web framework."""

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
from encoder_runtime.reranker import RerankerRuntime, RerankPair, is_reranker, load_reranker, sigmoid

__all__ = [
    "EncoderRuntime",
    "FillMaskResult",
    "FillMaskRuntime",
    "MicroBatcher",
    "ModelInfo",
    "NoMaskToken",
    "Overloaded",
    "RerankPair",
    "RerankerRuntime",
    "load_encoder",
    "is_reranker",
    "load_fill_mask",
    "load_reranker",
    "pipeline_output",
    "resolve_model_path",
    "sigmoid",
]
