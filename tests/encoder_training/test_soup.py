"""Weight averaging of models from one starting point (the default fill-mask model is such an average)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from encoder_training.pretraining.models import SparseBertForMaskedLM, bert_config
from encoder_training.pretraining.soup import average_models


def tiny_model(folder: Path, seed: int, layers: int = 2) -> Path:
    torch.manual_seed(seed)
    SparseBertForMaskedLM(bert_config(50, 16, layers, 2, 32, 32)).save_pretrained(folder)
    return folder


def test_average_is_the_mean_of_every_weight_and_loads(tmp_path: Path) -> None:
    first, second = tiny_model(tmp_path / "a", 0), tiny_model(tmp_path / "b", 1)
    out = average_models([first, second], tmp_path / "avg")
    a, b, mean = (load_file(str(folder / "model.safetensors")) for folder in (first, second, out))
    assert set(mean) == set(a)
    for key in a:
        assert torch.allclose(mean[key], (a[key] + b[key]) / 2)
    assert not torch.equal(
        mean["bert.embeddings.word_embeddings.weight"], a["bert.embeddings.word_embeddings.weight"]
    )
    assert SparseBertForMaskedLM.from_pretrained(out).config.num_hidden_layers == 2


def test_average_refuses_different_architectures(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not the same architecture"):
        average_models(
            [tiny_model(tmp_path / "a", 0), tiny_model(tmp_path / "b", 0, layers=3)], tmp_path / "x"
        )
    with pytest.raises(ValueError, match="at least two"):
        average_models([tmp_path / "a"], tmp_path / "y")
