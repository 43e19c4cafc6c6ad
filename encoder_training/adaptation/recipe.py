"""``AdaptConfig``: every tunable of ``cloze adapt`` with its default and where that default came from.

A default comes from the paper named beside it, from time, or from a run scored on SciFact's train queries
(and the MS MARCO subset) against an alternative; SciFact's test queries chose nothing. Each such choice is
one line of docs/design-decisions.md, with its figures and command; docs/adapt.md says what the recipe buys.
Not measured: the contrastive batch size, the mining range and margin, the preparation's share of the
budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from encoder_training.config_options import option


@dataclass
class AdaptConfig:
    model: str = field(
        default="", metadata=option("encoder folder to start from (default: the bundled all-MiniLM-L6-v2)")
    )
    corpus: str = field(
        default="",
        metadata=option(
            "the documents: JSONL / CSV / TSV / Parquet / folder of .txt, or an index folder", required=True
        ),
    )
    out: str = field(
        default="",
        metadata=option(
            "output sentence-transformers folder (work files go to OUT.work; rerun to resume)", required=True
        ),
    )
    max_time_minutes: float = field(
        default=60.0,
        metadata=option("wall-clock budget of the whole run: mining, MLM and contrastive stages"),
    )
    stages: list[str] = field(
        default_factory=lambda: ["mlm", "contrastive"],
        metadata=option("training stages, in order: mlm, contrastive"),
    )
    max_documents: int | None = field(default=None, metadata=option("read at most this many documents"))
    max_steps_per_stage: int | None = field(
        default=None,
        metadata=option(
            "also end each training stage after this many steps: a short run that does the same work on any machine"
        ),
    )
    seed: int = 42

    # stage 1: continued masked-language-model pre-training on the corpus
    # share of the budget; half of it lost on SciFact train (docs/design-decisions.md)
    mlm_fraction: float = 0.2
    mlm_masking: str = field(
        default="whole_word", metadata=option("what one mask covers", choices=("token", "whole_word", "span"))
    )
    mlm_rate: float = 0.15  # BERT
    # domain-adaptive pre-training (Gururangan 2020); 1e-5 tied on SciFact train (docs/design-decisions.md)
    mlm_learning_rate: float = 5e-5
    mlm_batch_size: int = 32
    mlm_block_size: int = 128
    mlm_warmup_steps: int = 20
    # guard: this weight times the squared distance of each block's embedding (masked input) from the
    # starting encoder's (block unmasked) joins the MLM loss (0: plain MLM; mlm.GuardedMaskedLM). Off: 10
    # tied on SciFact train, the contrastive stage repairing plain MLM's drift as well (docs/design-decisions.md)
    mlm_distill_weight: float = field(
        default=0.0,
        metadata=option(
            "weight of the pull of each MLM block's embedding toward the starting encoder's (0: plain MLM)"
        ),
    )

    # stage 2: contrastive fine-tuning on corpus-made pairs with mined hard negatives
    # ict | title | crop: title, crop and the two mixed tied ict on SciFact train, and ict needs no titles
    # (docs/design-decisions.md)
    pair_kinds: list[str] = field(
        default_factory=lambda: ["ict"], metadata=option("ict title crop (one kind per document per round)")
    )
    # ICT: leave the anchor sentence in its passage this often (ORQA); 0.5 tied on SciFact train
    # (docs/design-decisions.md)
    keep_sentence: float = 0.1
    pair_rounds: int = field(default=1, metadata=option("pairs per document (one per round)"))
    # in-batch negatives only lost on SciFact train (docs/design-decisions.md)
    mine_negatives: bool = field(default=True, metadata=option("mine hard negatives"))
    mine_range_max: int = field(
        default=50, metadata=option("candidates: the encoder's top-N passages for the anchor")
    )
    mine_range_min: int = field(default=0, metadata=option("skip this many top candidates (near-duplicates)"))
    mine_relative_margin: float = 0.05  # false-negative guard: NV-Retriever TopK-PercPos(95%)
    mine_max_score: float | None = field(
        default=None, metadata=option("never mine a candidate above this cosine")
    )
    # 2 lost on SciFact train, each step dearer (docs/design-decisions.md)
    num_negatives: int = 1
    # mining embeds the corpus once; half the window halves that time
    mine_max_seq_length: int = field(default=128, metadata=option("the window mining embeds passages with"))
    # share of the budget that mining and the starting encoder's embeddings (the distillation targets) may take:
    # both grow with the pairs, so where all of them would take longer (a slow machine, a big corpus), a random
    # subset that fits is trained on, sized by timing a sample first
    prep_fraction: float = field(
        default=0.3,
        metadata=option(
            "share of the budget mining and the starting encoder's embeddings may take; beyond it, a random "
            "subset of the pairs that fits is trained on"
        ),
    )
    general_pairs: list[str] = field(
        default_factory=list,
        metadata=option(
            "general pairs mixed into the contrastive stage against forgetting (named sets or JSONL/TSV)"
        ),
    )
    # 5e-5 tied on SciFact train (docs/design-decisions.md)
    contrastive_learning_rate: float = 3e-5
    contrastive_batch_size: int = 32
    max_seq_length: int = field(
        default=256,
        metadata=option("tokens per text in the contrastive stage: the window the index chunks documents to"),
    )
    warmup_steps: int = 20

    # forgetting guard during training: distillation toward the starting encoder's embeddings of the training
    # texts, this weight times their squared distance added to MNRL (0: off). 1.0 against 0 tied on SciFact
    # train and halved the loss on MS MARCO, a corpus the model knows (docs/design-decisions.md); only 1.0 ran
    distill_weight: float = field(
        default=1.0,
        metadata=option(
            "weight of the pull toward the starting encoder's embeddings during the contrastive stage (0: off)"
        ),
    )
    # the contrastive target: 0 is MNRL's one-hot; above 0, the in-batch distribution of a hybrid teacher, the
    # starting encoder's cosine plus this weight times BM25 over the anchor's best BM25 (lexical_teacher.py).
    # Off: 0.3 tied on SciFact train in three runs (docs/design-decisions.md)
    lexical_teacher_weight: float = field(
        default=0.0,
        metadata=option(
            "train toward a hybrid teacher: the starting encoder's cosine plus this weight times normalised "
            "BM25 (0: MNRL's one-hot target)"
        ),
    )

    # forgetting guard: interpolate the adapted weights with the starting model's (WiSE-FT)
    # weight of the adapted model (1.0: none); 0.25 was the best of 0.25, 0.5 and 1.0 on SciFact train and
    # MS MARCO (docs/design-decisions.md)
    interpolate: float = field(
        default=0.25,
        metadata=option("weight of the adapted model against the starting one (1.0: no interpolation)"),
    )

    # the result check (adaptation.guard): pairs held out from training (at most a fifth of the pairs; 0: off),
    # on which the blend above must beat the starting encoder, else the other blend weights are tried, else
    # the starting weights are kept
    guard_pairs: int = field(
        default=256,
        metadata=option(
            "pairs held out from training (at most a fifth) on which the result must beat the starting encoder, "
            "else a better blend or the starting weights are kept (0: no check)"
        ),
    )
    guard_alphas: list[float] = field(
        default_factory=lambda: [0.1, 0.5, 1.0],
        metadata=option(
            "the other blend weights the check tries when the --interpolate blend does not beat the start"
        ),
    )

    # a cross-encoder teacher (GPL; Wang et al. 2022): its score margins on (anchor, positive, mined negative)
    # rows train the student with MarginMSE, "beside" MNRL or "instead" of it; its grades join the check.
    # Off by default (docs/design-decisions.md)
    teacher: str = field(
        default="",
        metadata=option(
            "a cross-encoder (sentence-transformers CrossEncoder folder) whose score margins on the mined "
            "rows train the encoder with MarginMSE (GPL), and whose grades join the check"
        ),
    )
    teacher_mode: str = field(
        default="beside",
        metadata=option("beside: MarginMSE beside MNRL's in-batch negatives; instead: MarginMSE alone"),
    )
    teacher_fraction: float = field(
        default=0.25, metadata=option("share of the budget the teacher may spend scoring training rows")
    )
