"""Thin torch wrappers that give every backend the same inputs and one output tensor.

The ONNX export traces these very modules, so the torch and ONNX backends compute the same function.
"""

from __future__ import annotations

from pathlib import Path

import torch

from app.runtime.backends.base import Task


class TokenStates(torch.nn.Module):
    """Inputs in the fixed order (input_ids, attention_mask[, token_type_ids]); models without token types
    (``input_names`` of two) get two."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(**self._kwargs(input_ids, attention_mask, token_type_ids)).last_hidden_state

    def _kwargs(self, *inputs: torch.Tensor | None) -> dict[str, torch.Tensor]:
        return {
            name: value for name, value in zip(self.input_names, inputs, strict=False) if value is not None
        }


class MaskedLMLogits(TokenStates):
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(**self._kwargs(input_ids, attention_mask, token_type_ids)).logits


def load_module(path: Path, task: Task, input_names: tuple[str, ...]) -> torch.nn.Module:
    """The Hugging Face model in eval mode, wrapped for ``task``."""
    from transformers import AutoModel, AutoModelForMaskedLM

    if task == "embed":
        return TokenStates(AutoModel.from_pretrained(path).eval(), input_names).eval()
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    return MaskedLMLogits(model, input_names).eval()
