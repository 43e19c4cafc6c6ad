"""Dropout with its Bernoulli mask drawn by NumPy's PCG64: several times faster than torch's on a CPU
(benchmarks/results/pretrain_throughput.json measures the step it speeds up).

Profiling the tiny-cpu MLM step on two cores put a third of it in dropout's random numbers: torch draws
them on the CPU from one sequential Mersenne Twister (about 10 ns an element). NumPy's PCG64 yields 64 random
bits a nanosecond, four 16-bit draws. Same probability (quantised to 1/65536, with the matching rescaling, so the
expectation is exact), same autograd; off the CPU (CUDA's Philox is fast) torch's own dropout runs.
``use_fast_dropout`` swaps it into a model's ``nn.Dropout`` modules and its attention-probability dropout
(through a registered attention function: eager attention with this dropout while training, SDPA otherwise).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PreTrainedModel

ATTENTION = "cloze_fast_dropout"
_LEVELS = 1 << 16


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)
    threshold = round(p * _LEVELS)
    seed = int(torch.randint(2**62, (1,)))  # follows torch.manual_seed, so runs stay reproducible
    # Each raw 64-bit PCG64 word holds four independent 16-bit draws: cheaper than ``integers`` per draw.
    words = np.random.default_rng(seed).bit_generator.random_raw(-(-x.numel() // 4))
    draws = words.view(np.uint16)[: x.numel()]
    # The scaled keep-mask in one NumPy pass: kept elements are divided by the keep probability.
    scale = np.float32(_LEVELS / (_LEVELS - threshold))
    mask = torch.from_numpy(np.multiply(draws >= threshold, scale, dtype=np.float32)).view(x.shape)
    return x * mask.to(x.dtype)


class FastDropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **_,
) -> tuple[torch.Tensor, None]:
    """A Hugging Face attention function (``[batch, heads, len, d]`` in, ``[batch, len, heads, d]`` out)."""
    return attend(query, key, value, attention_mask, dropout if module.training else 0.0, scaling).transpose(
        1, 2
    ), None


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    scale: float | None,
) -> torch.Tensor:
    """Scaled dot-product attention; ``mask`` is boolean (True attends) or additive."""
    if dropout_p == 0.0 or query.device.type != "cpu":
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale
        )
    scores = torch.matmul(
        query * (scale or query.size(-1) ** -0.5), key.transpose(-1, -2)
    )  # scale the smaller
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = dropout(torch.softmax(scores, dim=-1), dropout_p)
    return torch.matmul(weights, value)


AttentionInterface.register(ATTENTION, attention)


def use_fast_dropout(model: nn.Module) -> nn.Module:
    """Swap ``model``'s dropout (modules and attention probabilities) for this module's, in place."""
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p))
    for sub in model.modules():
        if isinstance(sub, PreTrainedModel) and sub.config._attn_implementation != ATTENTION:
            sub.set_attn_implementation(ATTENTION)
    return model
