"""The inference runtime: FastAPI-free, shared by the service, the index worker and evaluation."""

from app.runtime.batcher import MicroBatcher, Overloaded
from app.runtime.encoder import EncoderRuntime, load_encoder
from app.runtime.fill_mask import FillMaskResult, FillMaskRuntime, NoMaskToken, load_fill_mask
from app.runtime.model_dir import ModelInfo, resolve_model_path

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
    "resolve_model_path",
]
