"""Tokenise once, truncate to the model's window (and say so), pad per batch, plan batches by tokens.

Texts are single sequences; a cross-encoder's (query, document) pairs are tokenised by ``PairTokenizer``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class Encoded:
    """One text as token ids, already cut to the model's window."""

    ids: tuple[int, ...]
    truncated: bool

    def __len__(self) -> int:
        return len(self.ids)


class TextTokenizer:
    def __init__(self, path: Path, max_tokens: int):
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(path)
        self.max_tokens = max_tokens
        self.input_names = tuple(name for name in _INPUTS if name in self.hf.model_input_names)
        self.pad_id = self.hf.pad_token_id if self.hf.pad_token_id is not None else 0
        self._fast = self.hf.backend_tokenizer.__class__.from_str(self.hf.backend_tokenizer.to_str())
        self._fast.no_padding()
        self._fast.enable_truncation(max_length=max_tokens)
        self._whole = self.hf.backend_tokenizer.__class__.from_str(self.hf.backend_tokenizer.to_str())
        self._whole.no_padding()
        self._whole.no_truncation()
        self.vocab_size = self._whole.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: list[str]) -> list[Encoded]:
        # ``encode_batch_fast`` skips character offsets, which nothing reading these ids needs
        return [
            Encoded(tuple(encoding.ids), bool(encoding.overflowing))
            for encoding in self._fast.encode_batch_fast(texts, add_special_tokens=True)
        ]

    def tokens(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict]]:
        """Every token of each text (no truncation), as TEI's ``/tokenize`` lists them: a special token has its
        own text and no offsets; any other the characters ``[start, stop)`` of the text it came from."""
        out = []
        for text, encoding in zip(
            texts, self._whole.encode_batch(texts, add_special_tokens=add_special_tokens), strict=True
        ):
            out.append(
                [
                    {"id": token_id, "text": token, "special": True, "start": None, "stop": None}
                    if special
                    else {
                        "id": token_id,
                        "text": text[start:stop],
                        "special": False,
                        "start": start,
                        "stop": stop,
                    }
                    for token_id, token, special, (start, stop) in zip(
                        encoding.ids,
                        encoding.tokens,
                        encoding.special_tokens_mask,
                        encoding.offsets,
                        strict=True,
                    )
                ]
            )
        return out

    def decode(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return self._whole.decode_batch(batch, skip_special_tokens=skip_special_tokens)

    def pad(self, batch: list[Encoded]) -> dict[str, np.ndarray]:
        width = max(len(item) for item in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        types = np.zeros_like(ids)
        for row, item in enumerate(batch):
            ids[row, : len(item)] = item.ids
            mask[row, : len(item)] = 1
            if isinstance(item, EncodedPair):
                types[row, : len(item)] = item.type_ids
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: arrays[name] for name in self.input_names}


@dataclass(frozen=True)
class EncodedPair(Encoded):
    """A (query, document) pair as one sequence: ``[CLS] query [SEP] document [SEP]`` with segment ids."""

    type_ids: tuple[int, ...] = ()


class PairTokenizer(TextTokenizer):
    """Tokenises (query, document) pairs for a cross-encoder, cut to the window on the document side only
    (the query is what every candidate is judged against). A query longer than ``max_query_share`` of the
    window is first cut to that many tokens, so a document always keeps the rest."""

    def __init__(self, path: Path, max_tokens: int, max_query_share: float = 0.5):
        super().__init__(path, max_tokens)
        self._fast.enable_truncation(max_length=max_tokens, strategy="only_second")
        specials = self._whole.num_special_tokens_to_add(True)
        self.max_query_tokens = max(1, int(max_tokens * max_query_share) - specials)

    def cut_query(self, query: str) -> tuple[str, bool]:
        """The query as a prefix of at most ``max_query_tokens`` tokens (cut on token offsets), and whether it
        was cut."""
        offsets = self._whole.encode(query, add_special_tokens=False).offsets
        if len(offsets) <= self.max_query_tokens:
            return query, False
        return query[: offsets[self.max_query_tokens - 1][1]], True

    def encode_pairs(self, pairs: list[tuple[str, str]]) -> list[EncodedPair]:
        cut = {query: self.cut_query(query) for query in {query for query, _ in pairs}}
        encodings = self._fast.encode_batch_fast(
            [(cut[query][0], document) for query, document in pairs], add_special_tokens=True
        )
        return [
            EncodedPair(tuple(e.ids), bool(e.overflowing) or cut[query][1], tuple(e.type_ids))
            for (query, _), e in zip(pairs, encodings, strict=True)
        ]

    def encode(self, texts: list) -> list[Encoded]:  # type: ignore[override]
        """``encode_pairs`` of anything that unpacks as (query, document): what calibration and the
        micro-batcher hand a tokenizer."""
        return list(self.encode_pairs([(query, document) for query, document in texts]))


def plan_batches(
    lengths: list[int],
    max_batch_tokens: int,
    max_batch_size: int,
    max_padding: float = 0.1,
    padding_tokens: int = 0,
) -> list[list[int]]:
    """Group indices sorted by length so each padded batch (count x longest) stays within the budget.

    Sorting is what cuts padding: neighbours have similar lengths. A batch is also cut when its padding
    would exceed both ``max_padding`` of its real tokens and ``padding_tokens``: on a CPU a forward pass
    costs little beyond its tokens, so a mixed crowd is cheaper as several length buckets than as one batch
    padded to its longest member; but each pass also has a fixed cost, which ``padding_tokens`` states in
    padded tokens, so a few texts of nearly the same length share one pass (the figures behind both:
    docs/design-decisions.md).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for index in order:
        longest = lengths[index]  # sorted ascending: the newcomer is the longest
        padded = (len(current) + 1) * longest
        padding = padded - (real + longest)
        too_padded = padding > max(max_padding * (real + longest), padding_tokens)
        if current and (padded > max_batch_tokens or len(current) >= max_batch_size or too_padded):
            batches.append(current)
            current, real = [], 0
        current.append(index)
        real += longest
    if current:
        batches.append(current)
    return batches
