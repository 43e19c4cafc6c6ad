"""Corpus reading, sequence packing and the masking collator.

Packing concatenates documents (separated by [SEP]) and cuts the token stream into fixed blocks of
``[CLS] ... [SEP]``: no padding, so every position carries signal and attention needs no mask.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from encoder_training.masking import (
    MaskingConfig,
    continuation_table,
    function_word_table,
    mask_tokens,
    salient_word_table,
)
from encoder_training.pretraining.recipes import PretrainConfig

TEXT_SUFFIXES = (".txt", ".raw", ".gz", ".text", ".md")


def text_files(inputs: list[str | Path]) -> list[Path]:
    """Files named directly, and every text file under named folders, in a stable order."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(p for p in item.rglob("*") if p.is_file() and p.name.endswith(TEXT_SUFFIXES))
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"no such input: {item}")
    if not files:
        raise FileNotFoundError(f"no text files in {inputs}")
    return files


def read_documents(inputs: list[str | Path]) -> Iterator[str]:
    """Paragraphs (blank-line separated) of every file; gzip and Latin-1 bytes are handled."""
    for path in text_files(inputs):
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = raw.decode("utf-8", errors="replace")
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = " ".join(paragraph.split())
            if len(paragraph) > 20:
                yield paragraph


def pack_blocks(tokenizer, documents: list[str], block_size: int) -> torch.Tensor:
    """Token ids ``[n_blocks, block_size]``, each ``[CLS] stream-slice [SEP]``; the ragged tail is dropped."""
    body = block_size - 2
    stream: list[int] = []
    for start in range(0, len(documents), 1000):
        encoded = tokenizer(documents[start : start + 1000], add_special_tokens=False)["input_ids"]
        for ids in encoded:
            stream += ids + [tokenizer.sep_token_id]
    usable = len(stream) // body * body
    if usable == 0:
        raise ValueError(f"corpus too small: {len(stream)} tokens for blocks of {block_size}")
    middle = torch.tensor(stream[:usable], dtype=torch.long).view(-1, body)
    cls = torch.full((len(middle), 1), tokenizer.cls_token_id, dtype=torch.long)
    sep = torch.full((len(middle), 1), tokenizer.sep_token_id, dtype=torch.long)
    return torch.cat([cls, middle, sep], dim=1)


class BlockDataset(torch.utils.data.Dataset):
    """Packed blocks as ``{"input_ids": ...}`` items, the shape the HF ``Trainer`` expects."""

    def __init__(self, blocks: torch.Tensor):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index]}


@dataclass
class MaskingCollator:
    """Stacks blocks and masks them afresh on every call (dynamic masking)."""

    mask_token_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    continuation: torch.Tensor
    masking: MaskingConfig
    never_mask: torch.Tensor | None = None

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer,
        masking: MaskingConfig,
        vocab_size: int | None = None,
        documents: list[str] | None = None,
    ) -> MaskingCollator:
        """``documents`` (the training text, with its case) are needed by salient-word masking only."""
        size = vocab_size or len(tokenizer)
        return cls(
            mask_token_id=tokenizer.mask_token_id,
            vocab_size=size,
            special_ids=tuple(tokenizer.all_special_ids),
            continuation=continuation_table(tokenizer.get_vocab(), size),
            masking=masking,
            never_mask=never_mask_table(tokenizer.get_vocab(), size, masking.words, documents),
        )

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        ids = torch.stack([item["input_ids"] for item in items])
        inputs, labels = mask_tokens(
            ids,
            mask_token_id=self.mask_token_id,
            vocab_size=self.vocab_size,
            special_ids=self.special_ids,
            config=self.masking,
            continuation=self.continuation,
            never_mask=self.never_mask,
        )
        return {"input_ids": inputs, "labels": labels}


def never_mask_table(
    vocab: dict[str, int], vocab_size: int, words: str, documents: list[str] | None
) -> torch.Tensor | None:
    """The per-vocabulary table of ids that ``words`` masking never selects (None for "all")."""
    if words == "content":
        return function_word_table(vocab, vocab_size)
    if words == "salient":
        if not documents:
            raise ValueError("salient-word masking needs the training documents")
        return salient_word_table(vocab, documents, vocab_size)
    return None


def masking_config(cfg: PretrainConfig) -> MaskingConfig:
    """The masking a recipe asks for."""
    return MaskingConfig(
        strategy=cfg.masking,
        rate=cfg.mask_rate,
        mask_prob=cfg.mask_prob,
        random_prob=cfg.random_prob,
        keep_prob=cfg.keep_prob,
        words=cfg.mask_words,
    )
