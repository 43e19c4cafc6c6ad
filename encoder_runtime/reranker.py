"""Cross-encoder reranking: a (query, document) pair in, one relevance logit out.

A reranker is a sentence-transformers ``CrossEncoder`` folder (a ``...ForSequenceClassification`` with one
label, as ``CrossEncoder.save`` writes it). Pairs are cut to the model's window on the document side only
(``PairTokenizer``), batched by tokens like embeddings, and scored by any backend (torch, ONNX fp32 or
calibrated int8). Scores are raw logits; ``sigmoid`` gives the 0..1 relevance TEI and Cohere report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from encoder_runtime.backends.factory import create_backend
from encoder_runtime.model_dir import ModelInfo, resolve_model_path
from encoder_runtime.tokenization import Encoded, PairTokenizer, plan_batches
from encoder_runtime.tokenized_runtime import TokenizedRuntime


@dataclass(frozen=True)
class RerankPair:
    """One candidate to score: unpacks as (query, document); its length is its characters, as the
    micro-batcher sizes what it tokenises on the event loop."""

    query: str
    document: str

    def __iter__(self):
        return iter((self.query, self.document))

    def __len__(self) -> int:
        return len(self.query) + len(self.document)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


class RerankerRuntime(TokenizedRuntime):
    task = "rerank"

    def probe(self) -> None:
        """A reranker gives one logit per pair; a classifier with several labels is something else."""
        labels = np.shape(self.backend(self.tokenizer.pad(self.encode([RerankPair("probe", "probe")]))))[-1]
        if labels != 1:
            raise ValueError(f"{self.info.path} is not a reranker: it gives {labels} labels per pair, not 1")

    def encode(self, texts: list) -> list[Encoded]:  # type: ignore[override]
        """Pairs (``RerankPair`` or (query, document) tuples) as tokens, cut on the document side."""
        return self.tokenizer.encode(texts)

    def run(self, items: list[Encoded]) -> list[np.float32]:
        """One padded forward pass: each pair's raw logit."""
        logits = self.backend(self.tokenizer.pad(items))
        return list(np.asarray(logits, dtype=np.float32).reshape(len(items), -1).squeeze(-1))

    def score_encoded(self, items: list[Encoded]) -> np.ndarray:
        batches = plan_batches([len(item) for item in items], *self.batch_budget)
        return np.asarray(self.run_batches(items, batches), dtype=np.float32).reshape(len(items))

    def score(self, query: str, documents: list[str]) -> np.ndarray:
        """Raw logits [n] of ``query`` against each document, in the documents' order (sorted by length and
        batched by tokens on the way)."""
        return self.score_encoded(self.encode([RerankPair(query, document) for document in documents]))


def is_reranker(path: Path) -> bool:
    """Whether a model folder is a cross-encoder: a sequence classifier (sentence-transformers marks its
    CrossEncoder folders, older ones only say so by their architecture)."""
    config = path / "config.json"
    st_config = path / "config_sentence_transformers.json"
    if st_config.is_file() and json.loads(st_config.read_text()).get("model_type") == "CrossEncoder":
        return True
    architectures = json.loads(config.read_text()).get("architectures", []) if config.is_file() else []
    return any(name.endswith("ForSequenceClassification") for name in architectures or [])


def load_reranker(
    model: str | Path,
    backend: str = "auto",
    device: str = "auto",
    threads: int = 0,
    onnx_cache: Path | None = None,
    max_batch_tokens: int | None = None,
    max_batch_size: int | None = None,
) -> RerankerRuntime:
    info = ModelInfo.read(resolve_model_path(model))
    if not is_reranker(info.path):
        raise ValueError(
            f"{info.path} is not a cross-encoder (a CrossEncoder folder: ...ForSequenceClassification, one label)"
        )
    tokenizer = PairTokenizer(info.path, info.max_tokens)
    engine = create_backend(info.path, "rerank", tokenizer.input_names, backend, device, threads, onnx_cache)
    return RerankerRuntime(info, tokenizer, engine, max_batch_tokens, max_batch_size)
