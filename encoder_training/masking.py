"""Dynamic masking for masked-language-model pre-training: BERT tokens, whole words, SpanBERT spans.

Masks are drawn afresh for every batch (RoBERTa's dynamic masking), so one pass over a packed corpus
never shows the model the same cloze twice. Everything is vectorised over the batch; the span strategy
loops over *rounds* (a handful per batch), each of which places one span in every row at once.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
STRATEGIES = ("token", "whole_word", "span")
# Which words may be selected: any, content words (no stop words or punctuation), or salient words only.
WORD_SETS = ("all", "content", "salient")


@dataclass(frozen=True)
class MaskingConfig:
    """What to mask and how: the selection rate and BERT's 80-10-10 split of the selected units."""

    strategy: str = "token"
    rate: float = 0.15
    mask_prob: float = 0.8
    random_prob: float = 0.1
    keep_prob: float = 0.1
    span_p: float = 0.2
    max_span: int = 10
    # "content": stop words and punctuation are never selected, so the loss goes to the words facts are
    # made of. "salient" (after REALM's salient-span masking): only names, the one-token words the corpus
    # writes capitalised mid-sentence (places, people, languages, nationalities, organisations).
    words: str = "all"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, not {self.strategy!r}")
        if self.words not in WORD_SETS:
            raise ValueError(f"words must be one of {WORD_SETS}, not {self.words!r}")
        if not 0.0 < self.rate < 1.0:
            raise ValueError(f"rate must be in (0, 1), not {self.rate}")
        total = self.mask_prob + self.random_prob + self.keep_prob
        if abs(total - 1.0) > 1e-6 or min(self.mask_prob, self.random_prob, self.keep_prob) < 0:
            raise ValueError(f"mask/random/keep probabilities must be >= 0 and sum to 1, not {total}")


def continuation_table(vocab: dict[str, int], vocab_size: int | None = None) -> torch.Tensor:
    """Bool per vocabulary id: True for WordPiece continuations (``##ing``), which never start a word."""
    table = torch.zeros(vocab_size or (max(vocab.values()) + 1), dtype=torch.bool)
    for token, index in vocab.items():
        if token.startswith("##") and index < table.numel():
            table[index] = True
    return table


def function_word_table(vocab: dict[str, int], vocab_size: int | None = None) -> torch.Tensor:
    """Bool per vocabulary id: True for English stop words and punctuation, never chosen by content-word masking."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    table = torch.zeros(vocab_size or (max(vocab.values()) + 1), dtype=torch.bool)
    for token, index in vocab.items():
        word = token[2:] if token.startswith("##") else token
        if index < table.numel() and (not word.isalnum() or word.lower() in ENGLISH_STOP_WORDS):
            table[index] = True
    return table


# A word preceded by a lower-case letter, digit or clause punctuation and one space: mid-sentence, so
# its capital (if any) is a name's, not the sentence's.
_MID_SENTENCE_WORD = re.compile(r"(?<=[a-z0-9,;:)] )([A-Za-z]+)\b")


def salient_word_table(
    vocab: dict[str, int], documents: Iterable[str], vocab_size: int | None = None, min_count: int = 2
) -> torch.Tensor:
    """Bool per vocabulary id: True for every id salient masking never selects.

    Salient are the whole-word vocabulary entries that ``documents`` write capitalised in at least half
    of their mid-sentence uses (and at least ``min_count`` times): "france", "french", "london", but not
    "may" or "new". The vocabulary may be uncased; the documents keep their case.
    """
    capitalised: Counter[str] = Counter()
    lower: Counter[str] = Counter()
    for document in documents:
        for match in _MID_SENTENCE_WORD.finditer(document):
            word = match.group(1)
            (capitalised if word[0].isupper() else lower)[word.lower()] += 1
    table = torch.ones(vocab_size or (max(vocab.values()) + 1), dtype=torch.bool)
    for token, index in vocab.items():
        key = token.lower()
        if index < table.numel() and capitalised[key] >= max(min_count, lower[key]):
            table[index] = False
    return table


def span_lengths(
    count: int, p: float = 0.2, max_span: int = 10, generator: torch.Generator | None = None
) -> torch.Tensor:
    """SpanBERT's span lengths: geometric(p) truncated to 1..max_span (mean 3.8 for p=0.2, max 10)."""
    lengths = torch.arange(1, max_span + 1, dtype=torch.float64)
    weights = p * (1 - p) ** (lengths - 1)
    return torch.multinomial(weights.float(), count, replacement=True, generator=generator) + 1


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Iterable[int],
    config: MaskingConfig | None = None,
    continuation: torch.Tensor | None = None,
    never_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask a batch ``[batch, seq]``; returns ``(inputs, labels)`` with labels -100 where no loss is taken.

    ``special_ids`` (CLS, SEP, PAD, ...) are never selected. ``continuation`` is a per-vocabulary bool table
    (see ``continuation_table``) marking sub-word continuations; ``whole_word`` and ``span`` need it so
    that every sub-token of a word shares one decision. ``never_mask`` is a per-vocabulary bool table of
    ids never selected (``function_word_table`` for ``words="content"``, ``salient_word_table`` for
    ``"salient"``); with a continuation table a word is selectable only if all its sub-tokens are.
    """
    config = config or MaskingConfig()
    specials = torch.tensor(sorted(set(special_ids)), dtype=input_ids.dtype, device=input_ids.device)
    candidate = ~torch.isin(input_ids, specials)
    if config.words != "all":
        if never_mask is None:
            raise ValueError(f"{config.words}-word masking needs its never-mask table")
        candidate = _selectable(
            candidate, never_mask.to(input_ids.device)[input_ids], input_ids, continuation
        )
    if config.strategy == "token":
        selected = _bernoulli(candidate.shape, config.rate, generator, input_ids.device) & candidate
        unit = torch.arange(input_ids.numel(), device=input_ids.device).view_as(input_ids)
    else:
        if continuation is None:
            raise ValueError(f"the {config.strategy} strategy needs the continuation table")
        word = _word_ids(candidate, continuation.to(input_ids.device)[input_ids])
        if config.strategy == "whole_word":
            chosen = _bernoulli((int(word.max()) + 2,), config.rate, generator, input_ids.device)
            selected, unit = chosen[word + 1] & candidate, word
        else:
            selected, unit = _select_spans(candidate, word, config, generator)
    inputs = _replace(input_ids, selected, unit, mask_token_id, vocab_size, specials, config, generator)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return inputs, labels


def _bernoulli(
    shape: tuple[int, ...] | torch.Size, p: float, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=device) < p


def _selectable(
    candidate: torch.Tensor,
    excluded: torch.Tensor,
    input_ids: torch.Tensor,
    continuation: torch.Tensor | None,
) -> torch.Tensor:
    """``candidate`` less the excluded positions, and less every word that has an excluded sub-token (so
    "paris" in "paris ##ian" is not masked alone)."""
    if continuation is None:
        return candidate & ~excluded
    word = _word_ids(candidate, continuation.to(input_ids.device)[input_ids])
    broken = torch.zeros(int(word.max()) + 2, dtype=torch.bool, device=input_ids.device)
    broken[word[excluded & candidate] + 1] = True
    return candidate & ~excluded & ~broken[word + 1]


def _word_ids(candidate: torch.Tensor, continues: torch.Tensor) -> torch.Tensor:
    """A global word index per position (-1 outside words); a word never crosses a special token or a row."""
    previous = torch.zeros_like(candidate)
    previous[:, 1:] = candidate[:, :-1]
    starts = candidate & (~continues | ~previous)
    word = torch.cumsum(starts.flatten(), 0).view_as(candidate) - 1
    return torch.where(candidate, word, torch.full_like(word, -1))


def _select_spans(
    candidate: torch.Tensor, word: torch.Tensor, config: MaskingConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """SpanBERT: spans of truncated-geometric length at random starts, grown to whole words, until each
    row has spent ``rate`` of its candidate tokens. Returns the selection and a span id per position,
    so the 80-10-10 decision is taken once per span."""
    rows, length = candidate.shape
    device = candidate.device
    budget = torch.round(candidate.sum(1).float() * config.rate).long()
    selected = torch.zeros_like(candidate)
    span_id = torch.full(candidate.shape, -1, dtype=torch.long, device=device)
    positions = torch.arange(length, device=device)
    words_total = int(word.max()) + 2
    for round_index in range(length):
        open_rows = (selected.sum(1) < budget) & (candidate & ~selected).any(1)
        if not open_rows.any():
            break
        weights = (candidate & ~selected).float() + (~open_rows).float()[:, None]
        start = torch.multinomial(weights, 1, generator=generator).squeeze(1)
        remaining = (budget - selected.sum(1)).clamp(min=1)
        size = torch.minimum(
            span_lengths(rows, config.span_p, config.max_span, generator).to(device), remaining
        )
        span = (positions >= start[:, None]) & (positions < (start + size)[:, None]) & candidate
        span &= open_rows[:, None]
        hit = torch.zeros(words_total, dtype=torch.bool, device=device)
        hit[word[span] + 1] = True
        grown = hit[word + 1] & candidate & ~selected
        span_id = torch.where(grown, round_index * rows + torch.arange(rows, device=device)[:, None], span_id)
        selected |= grown
    return selected, span_id


def _replace(
    input_ids: torch.Tensor,
    selected: torch.Tensor,
    unit: torch.Tensor,
    mask_token_id: int,
    vocab_size: int,
    specials: torch.Tensor,
    config: MaskingConfig,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """BERT's 80-10-10 with one draw per unit (token, word or span); random tokens are never specials."""
    offset = int(unit.min())
    draw = torch.rand(int(unit.max()) - offset + 1, generator=generator, device=input_ids.device)[
        unit - offset
    ]
    to_mask = selected & (draw < config.mask_prob)
    to_random = selected & (draw >= config.mask_prob) & (draw < config.mask_prob + config.random_prob)
    allowed = torch.ones(vocab_size, dtype=torch.bool, device=input_ids.device)
    allowed[specials[specials < vocab_size]] = False
    pool = allowed.nonzero().squeeze(1)
    random_ids = pool[torch.randint(len(pool), input_ids.shape, generator=generator, device=input_ids.device)]
    inputs = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    return torch.where(to_random, random_ids.to(input_ids.dtype), inputs)
