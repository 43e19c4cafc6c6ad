"""Property tests of dynamic masking, with statistical bounds over large batches.

Bounds are about 5 standard deviations wide for the sample sizes used, so a correct masker fails
with negligible probability while a wrong rate or split (e.g. 70-20-10) fails every time.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from encoder_training.masking import IGNORE_INDEX, MaskingConfig, mask_tokens, span_lengths

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = (PAD, UNK, CLS, SEP, MASK)
VOCAB = 40  # ids 5..24 start words, 25..39 are "##" continuations
CONTINUATION = torch.zeros(VOCAB, dtype=torch.bool)
CONTINUATION[25:] = True


def make_batch(rows: int, length: int, seed: int, pad_fraction: float = 0.2) -> torch.Tensor:
    """Rows of CLS words SEP PAD...: words are a start token then 0-3 continuations."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, length), generator=g)
    ids[:, 0] = CLS
    ids[:, 1] = torch.randint(5, 25, (rows,), generator=g)  # a continuation never opens a row
    lengths = (length * (1 - pad_fraction * torch.rand(rows, generator=g))).long().clamp(min=4)
    positions = torch.arange(length)
    ids[positions >= lengths[:, None]] = PAD
    ids[torch.arange(rows), lengths - 1] = SEP
    return ids


def run(ids: torch.Tensor, strategy: str, seed: int, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    return mask_tokens(
        ids,
        mask_token_id=MASK,
        vocab_size=VOCAB,
        special_ids=SPECIALS,
        config=MaskingConfig(strategy=strategy, **kw),
        continuation=CONTINUATION,
        generator=torch.Generator().manual_seed(seed),
    )


def candidates(ids: torch.Tensor) -> torch.Tensor:
    return ~torch.isin(ids, torch.tensor(SPECIALS))


def within(observed: float, expected: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(observed - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n) + 1e-9


@settings(max_examples=25, deadline=None)
@given(
    strategy=st.sampled_from(["token", "whole_word", "span"]),
    seed=st.integers(0, 10_000),
    rows=st.integers(1, 8),
    length=st.integers(4, 64),
    rate=st.floats(0.05, 0.5),
)
def test_specials_untouched_and_labels_exact(
    strategy: str, seed: int, rows: int, length: int, rate: float
) -> None:
    ids = make_batch(rows, length, seed)
    inputs, labels = run(ids, strategy, seed, rate=rate)
    special = ~candidates(ids)
    assert torch.equal(inputs[special], ids[special]), "a special or pad token was changed"
    assert (labels[special] == IGNORE_INDEX).all(), "a special or pad token was selected"
    chosen = labels != IGNORE_INDEX
    assert torch.equal(labels[chosen], ids[chosen]), "labels must hold the original ids where selected"
    assert torch.equal(inputs[~chosen], ids[~chosen]), "only selected positions may change"
    assert not torch.isin(inputs[chosen & (inputs != MASK)], torch.tensor(SPECIALS)).any()


@settings(max_examples=25, deadline=None)
@given(
    strategy=st.sampled_from(["whole_word", "span"]), seed=st.integers(0, 10_000), length=st.integers(8, 96)
)
def test_whole_words_never_split(strategy: str, seed: int, length: int) -> None:
    ids = make_batch(6, length, seed)
    _, labels = run(ids, strategy, seed)
    chosen = labels != IGNORE_INDEX
    continues = CONTINUATION[ids] & candidates(ids)
    # a continuation shares its decision with the token before it (which is in the same word)
    left = torch.roll(chosen, 1, dims=1)
    assert torch.equal(chosen[:, 1:][continues[:, 1:]], left[:, 1:][continues[:, 1:]])


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
@pytest.mark.parametrize("rate", [0.15, 0.3])
def test_selection_rate(strategy: str, rate: float) -> None:
    ids = make_batch(256, 128, seed=1)
    _, labels = run(ids, strategy, seed=2, rate=rate)
    n = int(candidates(ids).sum())
    observed = float((labels != IGNORE_INDEX).sum()) / n
    if strategy == "span":  # a per-row budget, overshooting by at most one word per row
        assert rate - 0.01 <= observed <= rate + 0.03, observed
    else:  # words are selected as units, so the variance is larger than per token: use word-level n
        units = n if strategy == "token" else int((~CONTINUATION[ids] & candidates(ids)).sum())
        assert within(observed, rate, units), observed


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
def test_80_10_10_split(strategy: str) -> None:
    ids = make_batch(512, 128, seed=3)
    inputs, labels = run(ids, strategy, seed=4, mask_prob=0.8, random_prob=0.1, keep_prob=0.1)
    chosen = labels != IGNORE_INDEX
    n = int(chosen.sum())
    masked = float((inputs[chosen] == MASK).sum()) / n
    kept = float((inputs[chosen] == ids[chosen]).sum()) / n
    pool = VOCAB - len(SPECIALS)
    expect_kept = 0.1 + 0.1 / pool  # a random replacement can draw the original
    # decisions are per unit, so the effective sample is smaller than n for words and spans
    units = n if strategy == "token" else n // 4
    assert within(masked, 0.8, units), masked
    assert within(kept, expect_kept, units), kept
    assert within(1 - masked - kept, 0.1 - 0.1 / pool, units), 1 - masked - kept


def test_custom_split_is_honoured() -> None:
    ids = make_batch(256, 128, seed=5)
    inputs, labels = run(ids, "token", seed=6, mask_prob=0.5, random_prob=0.0, keep_prob=0.5)
    chosen = labels != IGNORE_INDEX
    assert within(float((inputs[chosen] == MASK).float().mean()), 0.5, int(chosen.sum()))
    assert torch.isin(inputs[chosen], torch.tensor([MASK])).logical_or(inputs[chosen] == ids[chosen]).all()


def test_span_length_mean_matches_truncated_geometric() -> None:
    lengths = span_lengths(200_000, p=0.2, max_span=10, generator=torch.Generator().manual_seed(7)).double()
    k = torch.arange(1, 11, dtype=torch.float64)
    weights = 0.2 * 0.8 ** (k - 1)
    expected = float((k * weights).sum() / weights.sum())
    assert abs(expected - 3.8) < 0.05
    assert abs(float(lengths.mean()) - expected) < 5 * float(lengths.std()) / math.sqrt(len(lengths))
    assert int(lengths.min()) == 1 and int(lengths.max()) == 10


def test_spans_are_contiguous_runs() -> None:
    """Without continuations, span masking selects runs whose mean length is near the sampled mean."""
    ids = torch.randint(5, 25, (512, 256), generator=torch.Generator().manual_seed(8))
    _, labels = run(ids, "span", seed=9)
    chosen = (labels != IGNORE_INDEX).int()
    starts = int((torch.diff(chosen, dim=1, prepend=torch.zeros(512, 1, dtype=torch.int)) == 1).sum())
    mean_run = float(chosen.sum()) / starts
    # adjacent spans merge into longer runs and the last span of a row is cut to the budget
    assert 3.0 < mean_run < 5.0, mean_run


def test_masks_are_fresh_each_call() -> None:
    ids = make_batch(16, 64, seed=10)
    g = torch.Generator().manual_seed(11)
    kwargs = dict(mask_token_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, generator=g)
    first = mask_tokens(ids, **kwargs)[1]
    second = mask_tokens(ids, **kwargs)[1]
    assert not torch.equal(first, second)


def test_rejects_bad_config() -> None:
    with pytest.raises(ValueError):
        MaskingConfig(mask_prob=0.8, random_prob=0.2, keep_prob=0.1)
    with pytest.raises(ValueError):
        MaskingConfig(strategy="entity")
    with pytest.raises(ValueError):
        MaskingConfig(words="nouns")


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
def test_content_word_masking_never_selects_function_words(strategy: str) -> None:
    function_words = torch.zeros(VOCAB, dtype=torch.bool)
    function_words[5:12] = True  # as if ids 5..11 were "the", ",", "of", ...
    labels = restricted_labels(strategy, "content", function_words)
    chosen = labels[labels != IGNORE_INDEX]
    assert len(chosen) > 200 and not function_words[chosen].any()


@pytest.mark.parametrize("strategy", ["whole_word", "span"])
def test_restricted_masking_never_splits_a_word(strategy: str) -> None:
    """A word with one never-mask sub-token (id 30 here, as "##ian" in "paris ##ian") is never selected."""
    never_mask = torch.ones(VOCAB, dtype=torch.bool)
    never_mask[5:25] = False  # every word start is salient, continuations other than 30 too
    never_mask[25:30] = False
    never_mask[31:] = False
    ids = make_batch(64, 64, seed=5)
    labels = restricted_labels(strategy, "salient", never_mask, ids)
    word = word_numbers(ids)
    with_30 = set(word[ids == 30].tolist())
    selected_words = set(word[labels != IGNORE_INDEX].tolist())
    assert len(selected_words) > 100 and not selected_words & with_30
    assert (labels != IGNORE_INDEX).sum() > 200


def test_restricted_masking_needs_its_table() -> None:
    with pytest.raises(ValueError, match="salient"):
        restricted_labels("token", "salient", None)


def restricted_labels(
    strategy: str, words: str, never_mask: torch.Tensor | None, ids: torch.Tensor | None = None
) -> torch.Tensor:
    _, labels = mask_tokens(
        make_batch(64, 64, seed=3) if ids is None else ids,
        mask_token_id=MASK,
        vocab_size=VOCAB,
        special_ids=SPECIALS,
        config=MaskingConfig(strategy=strategy, rate=0.3, words=words),
        continuation=CONTINUATION,
        never_mask=never_mask,
        generator=torch.Generator().manual_seed(0),
    )
    return labels


def word_numbers(ids: torch.Tensor) -> torch.Tensor:
    """A word number per position: a word is a non-special start token and the continuations after it."""
    starts = ~CONTINUATION[ids] | torch.isin(ids, torch.tensor(SPECIALS))
    return torch.cumsum(starts.flatten(), 0).view_as(ids)


def test_salient_word_table_keeps_names_the_text_capitalises() -> None:
    from encoder_training.masking import salient_word_table

    vocab = {"[PAD]": 0, "france": 1, "may": 2, "the": 3, "london": 4, "##ian": 5, "rare": 6}
    documents = [
        "He went to France in May, and to London. She may go to France too.",
        "It is in London, they may say, and the Rare book is not rare, not rare at all.",
    ]
    table = salient_word_table(vocab, documents)
    assert [index for index in range(7) if not table[index]] == [1, 4]


def test_function_word_table_marks_stop_words_and_punctuation() -> None:
    from encoder_training.masking import function_word_table

    vocab = {"[PAD]": 0, "the": 1, ",": 2, "paris": 3, "##ing": 4, "1969": 5, "Of": 6}
    table = function_word_table(vocab)
    assert table.tolist() == [True, True, True, False, False, False, True]
