"""Fill-mask like the Hugging Face pipeline: per mask token, the top-k {score, token, token_str, sequence}.

Memory is bounded by masks, not by positions: the backend computes the MLM head only at mask positions
(``Backend.mask_logits``), a few hundred rows at a time, and each pass keeps only the top ``MAX_TOP_K``
tokens per mask (or the request's targets). A [positions x vocabulary] array is never made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from encoder_runtime.backends.base import Backend
from encoder_runtime.backends.factory import create_backend
from encoder_runtime.default_fill_mask import default_fill_mask_path
from encoder_runtime.model_dir import ModelInfo, resolve_model_path
from encoder_runtime.tokenization import Encoded, TextTokenizer
from encoder_runtime.tokenized_runtime import TokenizedRuntime

MAX_TOP_K = 50  # the most predictions per mask a request may ask for; each pass keeps this many


class NoMaskToken(ValueError):
    """The text has no mask token for the model to fill."""


@dataclass(frozen=True)
class FillMaskQuery:
    """A text and, optionally, the only token ids it may be filled with (the pipeline's ``targets``)."""

    text: str
    target_ids: tuple[int, ...] | None = None

    def __len__(self) -> int:  # its characters, as the micro-batcher sizes a text
        return len(self.text)


@dataclass(frozen=True)
class MaskedItem(Encoded):
    target_ids: tuple[int, ...] | None = None


@dataclass
class MaskScores:
    """Per mask of one text: candidate token ids and their probabilities, best first."""

    tokens: list[np.ndarray]
    scores: list[np.ndarray]


@dataclass
class FillMaskResult:
    masks: list[list[dict]] = field(default_factory=list)  # one list of predictions per answered mask
    truncated: bool = False
    masks_dropped: int = 0  # masks past the model's window, which it cannot see


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class FillMaskRuntime(TokenizedRuntime):
    task = "fill-mask"

    def __init__(self, info: ModelInfo, tokenizer: TextTokenizer, backend: Backend):
        self.info = info
        self.tokenizer = tokenizer
        self.backend = backend
        self.mask_token: str = tokenizer.hf.mask_token
        self.mask_id: int = tokenizer.hf.mask_token_id
        if self.mask_token is None:
            raise ValueError(f"{info.path} has no mask token: it is not a masked language model")

    def encode(self, texts: list[str | FillMaskQuery]) -> list[MaskedItem]:
        queries = [t if isinstance(t, FillMaskQuery) else FillMaskQuery(t) for t in texts]
        encoded = self.tokenizer.encode([q.text for q in queries])
        return [MaskedItem(e.ids, e.truncated, q.target_ids) for e, q in zip(encoded, queries, strict=True)]

    def mask_count(self, text: str) -> int:
        """The cost of a text for admission: its mask tokens (what the head runs on)."""
        return text.count(self.mask_token)

    def run(self, items: list[Encoded]) -> list[MaskScores]:
        """One padded forward pass; per item and mask the best ``MAX_TOP_K`` tokens (or its targets)."""
        inputs = self.tokenizer.pad(items)
        positions = [
            (row, col)
            for row, item in enumerate(items)
            for col, t in enumerate(item.ids)
            if t == self.mask_id
        ]
        out = [MaskScores([], []) for _ in items]
        if not positions:
            return out
        where = np.asarray(positions, dtype=np.int64)
        done = 0
        for logits in self.backend.mask_logits(inputs, where):
            probs = softmax(logits.astype(np.float32, copy=False))
            for offset, row_probs in enumerate(probs):
                row = int(where[done + offset, 0])
                targets = getattr(items[row], "target_ids", None)
                if targets:
                    pool = np.asarray(targets, dtype=np.int64)
                    best = pool[np.argsort(-row_probs[pool], kind="stable")]
                else:
                    k = min(MAX_TOP_K, row_probs.shape[0])
                    top = np.argpartition(-row_probs, k - 1)[:k]
                    best = top[np.lexsort((top, -row_probs[top]))]
                out[row].tokens.append(best.astype(np.int64))
                out[row].scores.append(row_probs[best].astype(np.float32))
            done += len(probs)
        return out

    def target_ids(self, targets: list[str]) -> list[int]:
        """As the Hugging Face pipeline: a target that is a vocabulary entry is that token, any other its first
        token; repeats count once. A target with no token at all is refused (the pipeline drops it)."""
        vocab = self.tokenizer.hf.get_vocab()
        ids: dict[int, None] = {}
        for target in targets:
            token = vocab.get(target)
            if token is None:
                pieces = self.tokenizer.hf(target, add_special_tokens=False)["input_ids"]
                if not pieces:
                    raise ValueError(f"target {target!r} is empty after tokenisation")
                token = pieces[0]
            ids.setdefault(token)
        return list(ids)

    def decode(self, text: str, item: Encoded, scores: MaskScores, top_k: int = 5) -> FillMaskResult:
        positions = [i for i, token in enumerate(item.ids) if token == self.mask_id]
        in_text = text.count(self.mask_token)
        if not positions and not in_text:
            raise NoMaskToken(f"no {self.mask_token} token in the input: the model fills {self.mask_token}")
        result = FillMaskResult(truncated=item.truncated, masks_dropped=max(in_text - len(positions), 0))
        # The pipeline's sequences: special tokens skipped for one mask, kept (so the other masks show) for several.
        single = len(positions) == 1
        for position, tokens, probs in zip(positions, scores.tokens, scores.scores, strict=True):
            result.masks.append(
                [
                    self._prediction(item, position, int(token), float(score), single)
                    for token, score in zip(tokens[:top_k], probs[:top_k], strict=True)
                ]
            )
        return result

    def _prediction(self, item: Encoded, position: int, token: int, score: float, skip_special: bool) -> dict:
        ids = list(item.ids)
        ids[position] = token
        ids = [i for i in ids if i != self.tokenizer.pad_id]
        return {
            "score": score,
            "token": token,
            "token_str": self.tokenizer.hf.decode([token]),
            "sequence": self.tokenizer.hf.decode(ids, skip_special_tokens=skip_special),
        }

    def fill_mask(
        self, texts: list[str], top_k: int = 5, targets: list[str] | None = None
    ) -> list[FillMaskResult]:
        """Offline path (one batch); the service goes through a MicroBatcher with ``encode``/``run``/``decode``."""
        target_ids = tuple(self.target_ids(targets)) if targets else None
        items = self.encode([FillMaskQuery(text, target_ids) for text in texts])
        return [
            self.decode(text, item, scores, top_k)
            for text, item, scores in zip(texts, items, self.run(items), strict=True)
        ]


def pipeline_output(results: list[FillMaskResult], inputs_is_list: bool) -> list:
    """The answer nested as the Hugging Face fill-mask pipeline nests it (transformers' ``FillMaskPipeline``):
    per input, a flat list of predictions for one mask and a list of such lists for several; one input (a
    string, or a list of one) is answered alone, several inputs as a list of their answers."""
    answers = [result.masks[0] if len(result.masks) == 1 else result.masks for result in results]
    return answers if inputs_is_list and len(answers) > 1 else answers[0]


def load_fill_mask(
    model: str | Path | None = None,
    backend: str = "auto",
    device: str = "auto",
    threads: int = 0,
    onnx_cache: Path | None = None,
) -> FillMaskRuntime:

    path = resolve_model_path(model) if model else default_fill_mask_path()
    info = ModelInfo.read(path)
    tokenizer = TextTokenizer(info.path, info.max_tokens)
    engine = create_backend(
        info.path, "fill-mask", tokenizer.input_names, backend, device, threads, onnx_cache
    )
    return FillMaskRuntime(info, tokenizer, engine)
