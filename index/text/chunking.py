"""Token-aware sliding windows: documents longer than the encoder's window are split with overlap.

Attention cost grows with the square of the sequence, so encoders have a fixed window (256 tokens for
MiniLM); text past it would be silently dropped. Overlapping windows keep every token inside some
chunk with context on both sides; a document then scores as its best chunk. Windows are cut on the
tokenizer's own offsets, so a chunk is an exact substring of the document and re-tokenises to (almost
exactly) the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_WINDOW = 8


def overlap_problem(window: int, overlap: int) -> str | None:
    """Why neighbouring chunks may not share ``overlap`` of ``window`` tokens (None when they may). At most
    half the window: each token then lands in at most two chunks, so a document's chunks (and the
    embedding work of an upsert) stay within twice its tokens over the window; a stride of one token made
    a 4 MB upsert about a million chunks."""
    if window < MIN_WINDOW:
        return f"chunk_window {window} is under {MIN_WINDOW} tokens"
    if not 0 <= overlap <= window // 2:
        return (
            f"chunk_overlap {overlap} is outside 0..{window // 2} (at most half of the {window}-token window)"
        )
    return None


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    tokens: int


class Chunker:
    """Split texts into windows of at most ``window`` tokens that overlap by ``overlap`` tokens."""

    def __init__(
        self, hf_tokenizer: Any, max_tokens: int, overlap: int | None = None, window: int | None = None
    ):
        from tokenizers import Tokenizer

        specials = hf_tokenizer.backend_tokenizer.num_special_tokens_to_add(False)
        longest = max(MIN_WINDOW, max_tokens - specials)  # what the model reads beside its special tokens
        self.window = longest if window is None else max(MIN_WINDOW, min(window, longest))
        self.overlap = min(self.window // 4 if overlap is None else overlap, self.window // 2)
        # A private copy of the fast tokenizer without truncation: we need the offsets of *all* tokens.
        self._fast = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        self._fast.no_truncation()
        self._fast.no_padding()

    @classmethod
    def for_encoder(
        cls, encoder: Any, overlap: int | None = None, window: int | None = None
    ) -> Chunker | WholeDocuments:
        if encoder.tokenizer is None:  # a collection of the caller's own vectors: one per document
            return WholeDocuments()
        return cls(encoder.tokenizer.hf, encoder.max_tokens, overlap, window)

    def split(self, texts: list[str]) -> list[list[Chunk]]:
        encodings = self._fast.encode_batch(texts, add_special_tokens=False)
        return [
            self._windows(text, encoding.offsets) for text, encoding in zip(texts, encodings, strict=True)
        ]

    def _windows(self, text: str, offsets: list[tuple[int, int]]) -> list[Chunk]:
        if len(offsets) <= self.window:
            return [Chunk(0, text, len(offsets))]
        chunks: list[Chunk] = []
        step = self.window - self.overlap
        start = 0
        while True:
            end = min(start + self.window, len(offsets))
            chunks.append(Chunk(len(chunks), text[offsets[start][0] : offsets[end - 1][1]], end - start))
            if end == len(offsets):
                return chunks
            start += step


class WholeDocuments:
    """One chunk per document, the whole text: where callers supply one vector per document, there is no
    window to cut to (and no tokenizer to cut with)."""

    window = None
    overlap = None

    def split(self, texts: list[str]) -> list[list[Chunk]]:
        return [[Chunk(0, text, 0)] for text in texts]
