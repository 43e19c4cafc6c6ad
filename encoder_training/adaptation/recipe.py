"""``AdaptConfig``: every tunable of ``cloze adapt`` with its default and where that default came from.

A default comes from the paper named beside it, from time, or from a run scored on SciFact's train queries
(and the MS MARCO subset) against an alternative; SciFact's test queries chose nothing. Each such choice is
one line of docs/design-decisions.md, with its figures and command; docs/adapt.md says what the recipe buys.
Not measured: the contrastive batch size, the mining range and margin, the preparation's share of the
budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AdaptConfig:
    model: str = ""  # encoder folder to start from ("" = the bundled all-MiniLM-L6-v2)
    corpus: str = ""  # JSONL / CSV / TSV / Parquet / folder of .txt, or an index folder
    out: str = ""
    max_time_minutes: float = 60.0  # the whole run: mining, MLM and contrastive stages together
    stages: list[str] = field(default_factory=lambda: ["mlm", "contrastive"])
    max_documents: int | None = None  # read at most this many documents (None: all)
    max_steps_per_stage: int | None = (
        None  # also stop each stage after this many steps (None: the clock alone)
    )
    seed: int = 42

    # stage 1: continued masked-language-model pre-training on the corpus
    # share of the budget; half of it lost on SciFact train (docs/design-decisions.md)
    mlm_fraction: float = 0.2
    mlm_masking: str = "whole_word"  # token | whole_word | span (encoder_training.masking)
    mlm_rate: float = 0.15  # BERT
    # domain-adaptive pre-training (Gururangan 2020); 1e-5 tied on SciFact train (docs/design-decisions.md)
    mlm_learning_rate: float = 5e-5
    mlm_batch_size: int = 32
    mlm_block_size: int = 128
    mlm_warmup_steps: int = 20
    # guard: this weight times the squared distance of each block's embedding (masked input) from the
    # starting encoder's (block unmasked) joins the MLM loss (0: plain MLM; mlm.GuardedMaskedLM). Off: 10
    # tied on SciFact train, the contrastive stage repairing plain MLM's drift as well (docs/design-decisions.md)
    mlm_distill_weight: float = 0.0

    # stage 2: contrastive fine-tuning on corpus-made pairs with mined hard negatives
    # ict | title | crop: title, crop and the two mixed tied ict on SciFact train, and ict needs no titles
    # (docs/design-decisions.md)
    pair_kinds: list[str] = field(default_factory=lambda: ["ict"])
    # ICT: leave the anchor sentence in its passage this often (ORQA); 0.5 tied on SciFact train
    # (docs/design-decisions.md)
    keep_sentence: float = 0.1
    pair_rounds: int = 1  # pairs per document (one per round)
    # in-batch negatives only lost on SciFact train (docs/design-decisions.md)
    mine_negatives: bool = True
    mine_range_max: int = 50  # candidates: the encoder's top-N passages for the anchor
    mine_range_min: int = 0  # skip this many top candidates (near-duplicates)
    mine_relative_margin: float = 0.05  # false-negative guard: NV-Retriever TopK-PercPos(95%)
    mine_max_score: float | None = None  # ... and never above this cosine
    # 2 lost on SciFact train, each step dearer (docs/design-decisions.md)
    num_negatives: int = 1
    mine_max_seq_length: int = 128  # mining embeds the corpus once; half the window halves that time
    # share of the budget that mining and the starting encoder's embeddings (the distillation targets) may take:
    # both grow with the pairs, so where all of them would take longer (a slow machine, a big corpus), a random
    # subset that fits is trained on, sized by timing a sample first
    prep_fraction: float = 0.3
    general_pairs: list[str] = field(default_factory=list)  # optional general pairs mixed in (forgetting)
    # 5e-5 tied on SciFact train (docs/design-decisions.md)
    contrastive_learning_rate: float = 3e-5
    contrastive_batch_size: int = 32
    max_seq_length: int = 256  # the window the index chunks documents to
    warmup_steps: int = 20

    # forgetting guard during training: distillation toward the starting encoder's embeddings of the training
    # texts, this weight times their squared distance added to MNRL (0: off). 1.0 against 0 tied on SciFact
    # train and halved the loss on MS MARCO, a corpus the model knows (docs/design-decisions.md); only 1.0 ran
    distill_weight: float = 1.0
    # the contrastive target: 0 is MNRL's one-hot; above 0, the in-batch distribution of a hybrid teacher, the
    # starting encoder's cosine plus this weight times BM25 over the anchor's best BM25 (lexical_teacher.py).
    # Off: 0.3 tied on SciFact train in three runs (docs/design-decisions.md)
    lexical_teacher_weight: float = 0.0

    # forgetting guard: interpolate the adapted weights with the starting model's (WiSE-FT)
    # weight of the adapted model (1.0: none); 0.25 was the best of 0.25, 0.5 and 1.0 on SciFact train and
    # MS MARCO (docs/design-decisions.md)
    interpolate: float = 0.25

    # the result check (adaptation.guard): pairs held out from training (at most a fifth of the pairs; 0: off),
    # on which the blend above must beat the starting encoder, else the other blend weights are tried, else
    # the starting weights are kept
    guard_pairs: int = 256
    guard_alphas: list[float] = field(default_factory=lambda: [0.1, 0.5, 1.0])

    # a cross-encoder teacher (GPL; Wang et al. 2022): its score margins on (anchor, positive, mined negative)
    # rows train the student with MarginMSE, "beside" MNRL or "instead" of it; its grades join the check.
    # Off by default (docs/design-decisions.md)
    teacher: str = ""  # a sentence-transformers CrossEncoder folder ("" = none)
    teacher_mode: str = "beside"
    teacher_fraction: float = 0.25  # share of the budget the teacher may spend scoring training rows
