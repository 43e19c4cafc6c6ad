"""What ``cloze train reranker`` takes: light enough for the CLI to build its options without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

LOSSES = ("bce", "mnrl")


@dataclass
class RerankConfig:
    """Everything that decides the result; stored verbatim in ``training.json``."""

    out: str
    beir: str | None = None
    split: str = "train"
    pairs: str | None = None
    corpus: str | None = None
    model: str = ""  # cross-encoder start: any BERT-style folder; "" = the bundled encoder's weights
    encoder: str = ""  # the first stage's encoder (mining and the dev check); "" = the bundled one
    backend: str = "auto"
    index: str | None = None  # an existing index over the corpus, opened read-only
    loss: str = "bce"
    num_negatives: int = 7
    range_min: int = 0
    range_max: int = 30
    relative_margin: float = 0.05
    max_length: int = 256
    batch_size: int = 16
    learning_rate: float = 3e-5
    warmup_steps: int = 30
    max_time_minutes: float = 60.0
    max_steps: int = 0  # 0: the clock ends training
    save_steps: int = 50
    dev_queries: int = 50
    dev_candidates: int = 30
    seed: int = 42
    min_epochs: float = 1.0  # refuse a budget that buys fewer (timed before training), unless ``force``
    force: bool = False
