"""Pre-training models: BERT MLM with a sparse top (output layer and top encoder layer), and ELECTRA.

The MLM output layer (hidden -> vocabulary) is the single largest matrix multiply of a small encoder;
computing it, and most of the top encoder layer, only at the ~15% selected positions removes 44% of the
tiny-cpu step's arithmetic. Weights keep the stock Hugging Face names, so the saved folders load with
``BertForMaskedLM`` / ``ElectraModel``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertForMaskedLM, ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining
from transformers.modeling_outputs import MaskedLMOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

from encoder_training.masking import IGNORE_INDEX


class SparseBertForMaskedLM(BertForMaskedLM):
    """``BertForMaskedLM`` whose training loss is computed only where labels are set.

    Two savings, neither of which changes the loss: the output layer (hidden -> vocabulary) runs at the
    selected positions only, and so does the top encoder layer, except for its keys and values, which
    every position still provides (the ~85% of positions without a label feed no later computation).
    """

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        if labels is None:
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **kwargs
            )
        selected = labels != IGNORE_INDEX
        hidden = self._hidden_at(input_ids, attention_mask, token_type_ids, selected)
        logits = self.cls(hidden)
        loss = F.cross_entropy(logits.float(), labels[selected])
        return MaskedLMOutput(loss=loss, logits=logits)

    def _hidden_at(self, input_ids, attention_mask, token_type_ids, selected: torch.Tensor) -> torch.Tensor:
        """Top-layer hidden states ``[n_selected, hidden]`` at the selected positions, in row-major order."""
        hidden = self.bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        additive = None
        if attention_mask is not None:  # [batch, 1, 1, keys], as every attention implementation takes it
            blocked = attention_mask[:, None, None, :] == 0
            additive = blocked.to(hidden.dtype) * torch.finfo(hidden.dtype).min
        *lower, top = self.bert.encoder.layer
        for layer in lower:
            hidden = layer(hidden, additive)
        return _layer_at(top, hidden, selected, additive)


def _layer_at(
    layer: nn.Module, hidden: torch.Tensor, selected: torch.Tensor, additive_mask: torch.Tensor | None
) -> torch.Tensor:
    """One ``BertLayer`` evaluated only at ``selected`` positions (keys and values from every position).

    Queries are packed per row into ``[batch, most selected in a row, hidden]``; the padding queries'
    outputs are dropped again, so their values never matter. Attention runs through the model's own
    attention implementation, dropout included.
    """
    attention = layer.attention.self
    batch, length, width = hidden.shape
    rows, slots = selected.nonzero(as_tuple=True)[0], (selected.cumsum(1) - 1)[selected]
    at_selected = hidden[selected]
    projected = attention.query(at_selected)  # bf16 under autocast, like the keys and values below
    queries = projected.new_zeros(batch, int(selected.sum(1).max()), width)
    queries[rows, slots] = projected

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch, -1, attention.num_attention_heads, attention.attention_head_size).transpose(1, 2)

    attend = ALL_ATTENTION_FUNCTIONS.get_interface(
        attention.config._attn_implementation, eager_attention_forward
    )
    context, _ = attend(
        attention,
        split(queries),
        split(attention.key(hidden)),
        split(attention.value(hidden)),
        additive_mask,
        dropout=attention.dropout.p if attention.training else 0.0,
        scaling=attention.scaling,
    )
    context = context.reshape(batch, -1, width)[rows, slots]
    attended = layer.attention.output(context, at_selected)
    return layer.output(layer.intermediate(attended), attended)


def bert_config(
    vocab_size: int, hidden: int, layers: int, heads: int, intermediate: int, positions: int
) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=positions,
        architectures=["BertForMaskedLM"],
    )


def freeze_below_top(model: BertForMaskedLM, top_layers: int) -> int:
    """Train only the top ``top_layers`` encoder layers and the MLM head transform and bias.

    The decoder stays tied to the (frozen) word embeddings, so what changes is small enough to ship as a
    delta over an existing encoder. Returns the number of trainable parameters.
    """
    total = model.config.num_hidden_layers
    for param in model.parameters():
        param.requires_grad = False
    for layer in model.bert.encoder.layer[total - top_layers :]:
        for param in layer.parameters():
            param.requires_grad = True
    for param in model.cls.predictions.transform.parameters():
        param.requires_grad = True
    model.cls.predictions.bias.requires_grad = True
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class ElectraPretrainer(nn.Module):
    """ELECTRA: a small MLM generator fills the masks, the discriminator spots replaced tokens.

    Generator and discriminator share all embeddings (the generator projects them to its narrower
    width); the loss is generator MLM + ``disc_weight`` x replaced-token detection over every token.
    """

    def __init__(
        self, discriminator: ElectraForPreTraining, generator: ElectraForMaskedLM, disc_weight: float = 50.0
    ):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.disc_weight = disc_weight
        generator.electra.embeddings = discriminator.electra.embeddings
        generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def build(
        cls,
        vocab_size: int,
        hidden: int,
        layers: int,
        heads: int,
        intermediate: int,
        positions: int,
        generator_fraction: float = 0.25,
        disc_weight: float = 50.0,
    ) -> ElectraPretrainer:
        common = dict(vocab_size=vocab_size, embedding_size=hidden, max_position_embeddings=positions)
        disc = ElectraConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            **common,
        )
        gen_heads = max(1, round(heads * generator_fraction))
        gen_hidden = max(gen_heads, round(hidden * generator_fraction) // gen_heads * gen_heads)
        gen = ElectraConfig(
            hidden_size=gen_hidden,
            num_hidden_layers=layers,
            num_attention_heads=gen_heads,
            intermediate_size=max(1, round(intermediate * generator_fraction)),
            **common,
        )
        return cls(ElectraForPreTraining(disc), ElectraForMaskedLM(gen), disc_weight)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask=None, **_) -> dict:
        selected = labels != IGNORE_INDEX
        hidden = self.generator.electra(input_ids, attention_mask=attention_mask)[0]
        gen_logits = self.generator.generator_lm_head(self.generator.generator_predictions(hidden[selected]))
        gen_loss = F.cross_entropy(gen_logits.float(), labels[selected])
        with torch.no_grad():
            sampled = sample_categorical(gen_logits.float())
            original = torch.where(selected, labels, input_ids)
            corrupted = input_ids.clone()
            corrupted[selected] = sampled
            replaced = corrupted != original  # a sample equal to the original counts as original
        disc_logits = self.discriminator(corrupted, attention_mask=attention_mask).logits.float()
        weights = attention_mask.float() if attention_mask is not None else torch.ones_like(disc_logits)
        disc_loss = F.binary_cross_entropy_with_logits(
            disc_logits, replaced.float(), weight=weights, reduction="sum"
        )
        disc_loss = disc_loss / weights.sum()
        with torch.no_grad():
            self.last_metrics = {
                "gen_loss": float(gen_loss),
                "disc_loss": float(disc_loss),
                "gen_accuracy": float((gen_logits.argmax(-1) == labels[selected]).float().mean()),
                "disc_accuracy": float(((disc_logits > 0) == replaced).float().mean()),
            }
        return {
            "loss": gen_loss + self.disc_weight * disc_loss,
            "disc_logits": disc_logits,
            "replaced": replaced,
        }


def sample_categorical(logits: torch.Tensor) -> torch.Tensor:
    """One draw per row from ``softmax(logits)`` by inverting the CDF: one uniform number a row, where
    ``torch.multinomial`` on a CPU draws one per vocabulary entry (a tenth of the ELECTRA step)."""
    cdf = torch.softmax(logits, -1).cumsum(-1)
    uniform = torch.rand(len(cdf), 1, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, uniform).squeeze(1).clamp_max(cdf.shape[-1] - 1)


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula; ties are broken arbitrarily."""
    scores, positive = scores.flatten().double(), positive.flatten().bool()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = torch.empty_like(scores)
    ranks[scores.argsort()] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
