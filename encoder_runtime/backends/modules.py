"""A thin torch wrapper that gives every backend the same inputs and one output tensor.

The ONNX export traces this very module, so the torch and ONNX backends compute the same function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from encoder_runtime.backends.base import Task

OUTPUT_OF_TASK = {"embed": "last_hidden_state", "fill-mask": "logits", "rerank": "logits"}


class SingleOutput(torch.nn.Module):
    """Inputs in the fixed order (input_ids, attention_mask[, token_type_ids]) -> one named model output.

    Models without token types (``input_names`` of two) get two inputs."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...], output: str):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.output = output

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inputs = (input_ids, attention_mask, token_type_ids)
        kwargs = {
            name: value for name, value in zip(self.input_names, inputs, strict=False) if value is not None
        }
        return getattr(self.model(**kwargs), self.output)


def load_module(path: Path, task: Task, input_names: tuple[str, ...], **model_kwargs: Any) -> torch.nn.Module:
    """The Hugging Face model in eval mode, wrapped for ``task``."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    loaders = {
        "embed": AutoModel,
        "fill-mask": AutoModelForMaskedLM,
        "rerank": AutoModelForSequenceClassification,  # a cross-encoder: one relevance logit per pair
    }
    loader = loaders[task]
    model = loader.from_pretrained(path, **model_kwargs).eval()
    return SingleOutput(model, input_names, OUTPUT_OF_TASK[task]).eval()


def masked_lm_parts(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(encoder, head) of a masked LM whose head maps hidden states to logits row by row: BERT's ``cls``,
    RoBERTa's ``lm_head``. None for other heads (the caller computes full logits then)."""
    encoder = getattr(model, "base_model", None)
    for name in ("cls", "lm_head"):
        head = getattr(model, name, None)
        if encoder is not None and encoder is not model and isinstance(head, torch.nn.Module):
            return encoder, head
    return None
