"""What ``cloze train finetune`` takes: light enough for the CLI to build its options without loading torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoder_training.config_options import comma_list, option

LOSSES = ("mnrl", "cached-mnrl", "cosine", "softmax")
DEFAULT_PAIRS = {
    "mnrl": ["snli-triplets", "coco", "msrp"],
    "cached-mnrl": ["snli-triplets", "coco", "msrp"],
    "cosine": ["stsb-train"],
    "softmax": ["snli-labelled"],
}
NAMED_PAIRS = "snli, snli-triplets, snli-labelled, coco, msrp, stsb-train"


@dataclass
class FinetuneConfig:
    """Everything that decides the result; stored verbatim in ``training.json``. Every field is an option."""

    model: str = field(metadata=option("encoder folder (MLM / ELECTRA output, HF or ST model)"))
    out: str = field(metadata=option("output sentence-transformers folder"))
    loss: str = field(default="mnrl", metadata=option(choices=LOSSES))
    pairs: list[str] = field(
        default_factory=list,
        metadata=option(f"named sets ({NAMED_PAIRS}) or JSONL/TSV files; default depends on --loss"),
    )
    columns: list[str] | None = field(
        default=None,
        metadata=option("comma-separated columns to read from pairs files, in loss order", parse=comma_list),
    )
    limit: int | None = field(default=None, metadata=option("at most this many rows per pairs source"))
    matryoshka_dims: list[int] = field(default_factory=list, metadata=option("e.g. 384 256 128 64"))
    pooling: str = field(default="mean", metadata=option(choices=("mean", "cls", "max")))
    normalize: bool = field(default=True, metadata=option("append an L2-normalisation module"))
    max_seq_length: int | None = None
    batch_size: int = 64
    mini_batch_size: int = field(default=16, metadata=option("cached-mnrl forward chunk"))
    learning_rate: float = field(default=2e-5, metadata=option(flags=("--lr", "--learning-rate")))
    warmup_ratio: float = 0.1
    epochs: float = 1.0
    max_steps: int = field(default=-1, metadata=option("overrides --epochs when > 0"))
    eval_steps: int = field(default=0, metadata=option("STS-B dev evaluation every N steps (0: at the end)"))
    eval_pairs: int | None = field(
        default=500, metadata=option("STS-B dev pairs for evaluation during training")
    )
    seed: int = 42
    data_dir: str = field(default="", metadata=option("the data folder named sets are read from"))

    def sources(self) -> list[str]:
        return self.pairs or DEFAULT_PAIRS[self.loss]
