"""The CPU-fast dropout and ELECTRA's sampler: same distributions as torch's, checked statistically."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from encoder_training.pretraining.fast_dropout import ATTENTION, FastDropout, dropout, use_fast_dropout
from encoder_training.pretraining.models import (
    ElectraPretrainer,
    SparseBertForMaskedLM,
    bert_config,
    sample_categorical,
)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_rate_scale_and_gradient(p: float) -> None:
    x = torch.ones(400_000, requires_grad=True)
    y = dropout(x, p)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / x.numel())
    assert abs(y.mean().item() - 1.0) < 0.01  # kept elements are scaled by 1 / (1 - p): unbiased
    y.sum().backward()
    assert torch.equal(x.grad == 0, y == 0) and torch.allclose(x.grad, y.detach())


def test_dropout_follows_torch_seed_and_mode() -> None:
    x = torch.randn(64, 64)
    torch.manual_seed(3)
    first = dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(x, 0.1))
    assert not torch.equal(first, dropout(x, 0.1))
    assert torch.equal(dropout(x, 0.1, training=False), x)
    assert dropout(x.bfloat16(), 0.1).dtype == torch.bfloat16


def test_use_fast_dropout_swaps_every_dropout_and_the_attention() -> None:
    model = use_fast_dropout(ElectraPretrainer.build(100, 32, 2, 2, 64, 64))
    assert not any(type(m) is nn.Dropout for m in model.modules())
    assert any(isinstance(m, FastDropout) for m in model.modules())
    assert model.discriminator.config._attn_implementation == ATTENTION
    assert model.generator.config._attn_implementation == ATTENTION


def test_fast_dropout_model_matches_the_stock_model_in_eval_and_drops_in_training() -> None:
    torch.manual_seed(0)
    stock = SparseBertForMaskedLM(bert_config(100, 32, 2, 2, 64, 64)).eval()
    fast = use_fast_dropout(SparseBertForMaskedLM(bert_config(100, 32, 2, 2, 64, 64)))
    fast.load_state_dict(stock.state_dict())
    ids = torch.randint(5, 100, (4, 16))
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]
    expected = stock(input_ids=ids, labels=labels).loss
    assert torch.allclose(fast.eval()(input_ids=ids, labels=labels).loss, expected, atol=1e-5)
    fast.train()
    assert not torch.allclose(fast(input_ids=ids, labels=labels).loss, expected, atol=1e-3)


def test_sample_categorical_follows_the_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(100_000, 1)
    counts = torch.bincount(sample_categorical(logits), minlength=4).float()
    expected = torch.softmax(logits[0], -1) * len(logits)
    chi_square = ((counts - expected) ** 2 / expected).sum().item()
    assert chi_square < 20  # 3 degrees of freedom: p < 0.0002 for a correct sampler
    assert sample_categorical(torch.tensor([[-1e9, 5.0, -1e9]])).item() == 1
