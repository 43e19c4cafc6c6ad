"""What ``cloze train reranker`` takes: light enough for the CLI to build its options without loading torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoder_training.config_options import option

LOSSES = ("bce", "mnrl")
BACKENDS = ("auto", "torch", "onnx", "onnx-int8")


@dataclass
class RerankConfig:
    """Everything that decides the result; stored verbatim in ``training.json``. Every field is an option."""

    out: str = field(
        metadata=option("output CrossEncoder folder (work files go to OUT.work; rerun to resume)")
    )
    beir: str | None = field(
        default=None,
        metadata=option("a BEIR-layout folder (corpus.jsonl[.gz], queries.jsonl, qrels/SPLIT.tsv)"),
    )
    split: str = field(default="train", metadata=option("the BEIR qrels split to train on"))
    pairs: str | None = field(
        default=None,
        metadata=option('JSONL of judged pairs: {"query": ..., "positive": ...} (optional "positive_id")'),
    )
    corpus: str | None = field(
        default=None,
        metadata=option(
            "the documents negatives are mined from (with --pairs; default: the positives themselves)"
        ),
    )
    model: str = field(
        default="",
        metadata=option(
            "starting weights: any BERT-style folder (default: the bundled encoder's, with a new head)"
        ),
    )
    encoder: str = field(
        default="",
        metadata=option("the first stage's encoder for mining and the dev check (default: the bundled one)"),
    )
    backend: str = field(
        default="auto", metadata=option("the first stage encoder's backend", choices=BACKENDS)
    )
    index: str | None = field(
        default=None,
        metadata=option(
            "an existing index over the corpus to mine from (opened read-only; default: build one in OUT.work)"
        ),
    )
    loss: str = field(
        default="bce",
        metadata=option(
            "bce: pointwise with hard negatives; mnrl: listwise over hard and in-batch negatives",
            choices=LOSSES,
        ),
    )
    num_negatives: int = field(default=7, metadata=option("hard negatives per query"))
    range_min: int = field(default=0, metadata=option("skip this many top first-stage candidates outright"))
    range_max: int = field(default=30, metadata=option("first-stage candidates looked at per query"))
    relative_margin: float = field(
        default=0.05,
        metadata=option(
            "false-negative guard: skip a candidate whose dense score is above (1 - margin) x the positive's (0: off)"
        ),
    )
    max_length: int = field(
        default=256, metadata=option("tokens of query + passage (the passage side is cut)")
    )
    batch_size: int = 16
    learning_rate: float = 3e-5
    warmup_steps: int = 30
    max_time_minutes: float = field(
        default=60.0,
        metadata=option("wall-clock budget of the training stage (mining and the dev check come on top)"),
    )
    max_steps: int = field(
        default=0, metadata=option("also stop after this many steps (0: the clock decides)")
    )
    save_steps: int = field(
        default=50, metadata=option("checkpoint every N steps (what a rerun resumes from)")
    )
    dev_queries: int = field(
        default=50, metadata=option("judged queries held out for the dev check (at most a fifth)")
    )
    dev_candidates: int = field(default=30, metadata=option("first-stage candidates the dev check reranks"))
    seed: int = 42
