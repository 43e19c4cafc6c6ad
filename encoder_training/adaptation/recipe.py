"""``AdaptConfig``: every tunable of ``cloze adapt`` with its default and where that default came from.

Honest status (docs/adapt.md): on two CPU cores a 60-minute run and its evaluation take over an hour, so
one default was swept: ``interpolate``, after the fact on the 60-minute run's encoders, scored on SciFact's
train queries (809; ``benchmarks/adapt_guard_sweep.py``); ``distill_weight`` 1.0 was set against 0 on
SciFact train and the MS MARCO subset (one run each). Every other default comes from the paper named
beside it, or from time (``mine_max_seq_length``; ``mlm_fraction`` at first); nine were held against
train-scored alternative runs and kept (``mlm_learning_rate``, ``mlm_fraction``, ``mlm_distill_weight``,
``mine_negatives``, ``keep_sentence``, ``contrastive_learning_rate`` and ``num_negatives`` against one
each, ``lexical_teacher_weight`` against three, ``pair_kinds`` against three). Not measured: the
contrastive batch size, the mining range and margin. SciFact's test queries chose nothing: ``benchmarks/results/adapt_test_60min.json``
reports on them, it did not pick anything.
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
    seed: int = 42

    # stage 1: continued masked-language-model pre-training on the corpus
    # share of the budget; 0.1 against it on SciFact train: dense -0.005, hybrid -0.001
    # (benchmarks/results/adapt_mlm_share.json), so kept
    mlm_fraction: float = 0.2
    mlm_masking: str = "whole_word"  # token | whole_word | span (encoder_training.masking)
    mlm_rate: float = 0.15  # BERT
    # domain-adaptive pre-training (Gururangan 2020); 1e-5 measured on SciFact train: +0.001 dense, within
    # one run's noise (benchmarks/results/adapt_mlm_lr1e-5.json), so kept
    mlm_learning_rate: float = 5e-5
    mlm_batch_size: int = 32
    mlm_block_size: int = 128
    mlm_warmup_steps: int = 20
    # guard: this weight times the squared distance of each block's embedding (masked input) from the
    # starting encoder's (block unmasked) joins the MLM loss (0: plain MLM; mlm.GuardedMaskedLM). 10 against 0
    # on SciFact train, one 60-minute run: the MLM stage alone kept 0.6804 dense against plain's 0.6660, the
    # whole run a tie (0.6840 against 0.6862; benchmarks/results/adapt_mlm_guard.json), so off
    mlm_distill_weight: float = 0.0

    # stage 2: contrastive fine-tuning on corpus-made pairs with mined hard negatives
    # ict | title | crop, each measured on SciFact train (one 60-minute run each) against ict: title dense
    # +0.004, hybrid -0.005 (benchmarks/results/adapt_title_pairs.json); crop -0.0015 / -0.0004 with
    # distillation on (adapt_crop_pairs.json); ict and title mixed -0.0014 / -0.0015
    # (adapt_ict_title_pairs.json). Ties all; ict also needs no titles
    pair_kinds: list[str] = field(default_factory=lambda: ["ict"])
    # ICT: leave the anchor sentence in its passage this often (ORQA). 0.5 against it on SciFact train, one
    # 60-minute run: dense -0.0018, hybrid +0.0002 (benchmarks/results/adapt_keep_sentence.json), so kept
    keep_sentence: float = 0.1
    pair_rounds: int = 1  # pairs per document (one per round)
    # against in-batch negatives only, distillation on, one 60-minute run: SciFact train dense 0.6862 against
    # 0.6805, hybrid 0.7180 against 0.7150 (benchmarks/results/adapt_no_negatives_distill.json), so kept
    mine_negatives: bool = True
    mine_range_max: int = 50  # candidates: the encoder's top-N passages for the anchor
    mine_range_min: int = 0  # skip this many top candidates (near-duplicates)
    mine_relative_margin: float = 0.05  # false-negative guard: NV-Retriever TopK-PercPos(95%)
    mine_max_score: float | None = None  # ... and never above this cosine
    # 2 against it on SciFact train, one 60-minute run: dense -0.0042, hybrid -0.0011, a step 1.8x as dear
    # (benchmarks/results/adapt_num_negatives.json), so kept
    num_negatives: int = 1
    mine_max_seq_length: int = 128  # mining embeds the corpus once; half the window halves that time
    general_pairs: list[str] = field(default_factory=list)  # optional general pairs mixed in (forgetting)
    # a little above the 2e-5 of the ICT run in DESIGN.md; 5e-5 against it on SciFact train, one 60-minute
    # run: dense -0.0010, hybrid +0.0003 (benchmarks/results/adapt_contrastive_lr.json), so kept
    contrastive_learning_rate: float = 3e-5
    contrastive_batch_size: int = 32
    max_seq_length: int = 256  # the window the index chunks documents to
    warmup_steps: int = 20

    # forgetting guard during training: distillation toward the starting encoder's embeddings of the training
    # texts, this weight times their squared distance added to MNRL (0: off). 1.0 against 0, one run each, at
    # interpolation 0.25: SciFact train dense 0.686 vs 0.683, hybrid 0.718 vs 0.718; MS MARCO dense -0.006 vs
    # -0.010 from bundled (benchmarks/results/adapt_distill.json). Only 1.0 was run
    distill_weight: float = 1.0
    # the contrastive target: 0 is MNRL's one-hot; above 0, the in-batch distribution of a hybrid teacher, the
    # starting encoder's cosine plus this weight times BM25 over the anchor's best BM25 (lexical_teacher.py)
    lexical_teacher_weight: float = 0.0

    # forgetting guard: interpolate the adapted weights with the starting model's (WiSE-FT)
    # weight of the adapted model (1.0: none). Swept after the 60-minute run on SciFact's train queries (dense
    # nDCG@10: 1.0 0.654, 0.5 0.676, 0.25 0.683, bundled 0.678; benchmarks/results/adapt_guard_sweep.json)
    interpolate: float = 0.25
