"""Sentence embeddings: token states from any backend, pooled and normalised as the model says."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from encoder_runtime.backends.factory import create_backend
from encoder_runtime.model_dir import ModelInfo, resolve_model_path
from encoder_runtime.tokenization import Encoded, TextTokenizer, plan_batches
from encoder_runtime.tokenized_runtime import TokenizedRuntime


def pool(states: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    if mode == "cls":
        return states[:, 0]
    weights = mask[..., None].astype(states.dtype)
    if mode == "max":
        return np.where(weights > 0, states, -np.inf).max(axis=1)
    return (states * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    # einsum rather than np.linalg.norm: the service normalises one vector a request on its event loop,
    # where norm's several passes and checks cost more than the arithmetic
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))[:, None]
    return vectors / np.maximum(norms, 1e-12)


# Texts tokenised at once while the previous chunk's passes run (``EncoderRuntime.embed``): a chunk holds a
# dozen GPU passes of 8,192 tokens, so each chunk is still sorted by length over a wide pool.
TOKENIZE_AHEAD = 4096


class EncoderRuntime(TokenizedRuntime):
    task = "embed"

    def probe(self) -> None:
        self.dimension = int(self.run(self.encode(["dimension probe"]))[0].shape[0])

    def run(self, items: list[Encoded]) -> list[np.ndarray]:
        """One padded forward pass over ``items``; pooled, not yet normalised (callers choose)."""
        inputs = self.tokenizer.pad(items)
        on_device = getattr(self.backend, "pooled", None)  # torch pools where the pass ran
        if on_device is not None:
            return list(on_device(inputs, self.info.pooling))
        states = self.backend(inputs)
        return list(pool(states, inputs["attention_mask"], self.info.pooling).astype(np.float32))

    def finish(self, vectors: list[np.ndarray], normalize: bool | None = None) -> np.ndarray:
        if not vectors:
            matrix = np.zeros((0, self.dimension), np.float32)
        elif len(vectors) == 1:  # one text a request is the common case: no stacking
            matrix = vectors[0].astype(np.float32, copy=False)[None, :]
        else:
            matrix = np.stack(vectors).astype(np.float32, copy=False)
        return l2_normalize(matrix) if (self.info.normalize if normalize is None else normalize) else matrix

    def embed_encoded(self, items: list[Encoded], normalize: bool | None = None) -> np.ndarray:
        batches = plan_batches([len(item) for item in items], *self.batch_budget)
        return self.finish(self.run_batches(items, batches), normalize)

    def embed(self, texts: list[str], normalize: bool | None = None) -> np.ndarray:
        """float32 [n, d]: sorted by length and batched by tokens, returned in the caller's order.

        Many texts are tokenised a chunk ahead of the passes, on a worker thread (the fast tokenizer spreads
        a batch over the cores and releases the GIL), as TEI does: on a GPU tokenising first and then running
        the passes took 60% longer than the passes alone (``../shared/measurements/gpu-h100-2026-12-05.json``)."""
        chunks = [texts[start : start + TOKENIZE_AHEAD] for start in range(0, len(texts), TOKENIZE_AHEAD)]
        if len(chunks) <= 1:
            return self.embed_encoded(self.encode(texts), normalize)
        vectors: list[np.ndarray] = []
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize-ahead") as tokenizer:
            upcoming = tokenizer.submit(self.encode, chunks[0])
            for following in [*chunks[1:], None]:
                items = upcoming.result()
                if following is not None:
                    upcoming = tokenizer.submit(self.encode, following)
                vectors += self.run_batches(
                    items, plan_batches([len(item) for item in items], *self.batch_budget)
                )
        return self.finish(vectors, normalize)


def load_encoder(
    model: str | Path | None = None,
    backend: str = "auto",
    device: str = "auto",
    threads: int = 0,
    onnx_cache: Path | None = None,
    max_batch_tokens: int | None = None,
    max_batch_size: int | None = None,
) -> EncoderRuntime:

    info = ModelInfo.read(resolve_model_path(model))
    tokenizer = TextTokenizer(info.path, info.max_tokens)
    engine = create_backend(info.path, "embed", tokenizer.input_names, backend, device, threads, onnx_cache)
    return EncoderRuntime(info, tokenizer, engine, max_batch_tokens, max_batch_size)
