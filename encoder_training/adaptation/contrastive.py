"""Stage 2: contrastive fine-tuning on the pairs the corpus makes (``corpus.make_pairs``), with hard
negatives mined from the corpus by the starting encoder, through the sentence-transformers trainer.

Mining is sentence-transformers' ``mine_hard_negatives``: for each anchor, the starting encoder's top
``mine_range_max`` passages are the candidates, and the false-negative guard is NV-Retriever's
TopK-PercPos (Moreira et al. 2024): a candidate scoring above ``(1 - relative_margin)`` times the
positive's score is too close to be trusted as a negative and is skipped.

With ``distill_weight`` above zero the loss also pulls every text's embedding toward the starting
encoder's embedding of it (``DistilledRankingLoss``): a forgetting guard that acts during training, where
the weight interpolation of ``run.interpolate`` acts after it.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import torch
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.losses.merged_forward import embed_columns
from sentence_transformers.base.sampler import BatchSamplers
from sentence_transformers.sentence_transformer.losses import MarginMSELoss, MultipleNegativesRankingLoss
from sentence_transformers.util import cos_sim, pairwise_cos_sim
from torch import nn

from encoder_training.adaptation.lexical_teacher import LexicalTeacher
from encoder_training.adaptation.recipe import AdaptConfig
from encoder_training.adaptation.timing import ResumableTimeBox, RunState, train_resuming
from encoder_training.pretraining.train import budget_schedule

log = logging.getLogger(__name__)
MINED = "mined.jsonl"
TEACHER = "teacher.pt"


def fit_estimate(
    model, pairs: list[dict[str, str]], config: AdaptConfig, seconds: float, with_targets: bool
) -> dict:
    """How many of ``pairs`` mining (and, ``with_targets``, the starting encoder's embeddings of their texts)
    can take in ``seconds``: all of them, or fewer, from the time a sample of their texts takes to embed at
    each window (``kept``, with the estimate behind it)."""
    sample = random.Random(config.seed).sample(pairs, min(16, len(pairs)))
    texts = [pair[column] for pair in sample for column in ("anchor", "positive")]
    windows = ([config.mine_max_seq_length] if config.mine_negatives else []) + (
        [config.max_seq_length] if with_targets else []
    )
    per_pair = 0.0
    for window in windows:
        previous, model.max_seq_length = model.max_seq_length, window
        try:
            # the first call's one-off costs are not per text
            model.encode(texts[:2], show_progress_bar=False)
            began = time.perf_counter()
            model.encode(texts, batch_size=len(texts), show_progress_bar=False)
            per_pair += 2 * (time.perf_counter() - began) / len(texts)  # an anchor and a positive a pair
        finally:
            model.max_seq_length = previous
    fits = len(pairs) if per_pair == 0 else max(int(seconds / per_pair), 2 * config.contrastive_batch_size)
    kept = min(fits, len(pairs))
    if kept < len(pairs):
        log.warning(
            "embedding the texts of all %d pairs would take about %.0f min here, more than the %.0f min "
            "--prep-fraction leaves: training on %d pairs picked at random; raise --max-time-minutes to use "
            "them all",
            len(pairs), per_pair * len(pairs) / 60, seconds / 60, kept,
        )  # fmt: skip
    return {
        "pairs": len(pairs),
        "kept": kept,
        "estimate_seconds": round(per_pair * len(pairs), 1),
        "allowed_seconds": round(seconds, 1),
    }


def sample_pairs(pairs: list[dict[str, str]], kept: int, seed: int) -> list[dict[str, str]]:
    """``kept`` of ``pairs`` picked at random (the same ones on a resume), in their order."""
    if kept >= len(pairs):
        return pairs
    chosen = set(random.Random(seed).sample(range(len(pairs)), kept))
    return [pair for number, pair in enumerate(pairs) if number in chosen]


def mine(config: AdaptConfig, model, pairs: list[dict[str, str]], work: Path):
    """(anchor, positive, negative_1..n) rows, one per pair; cached in ``work/mined.jsonl`` so a resume does not re-mine."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    cached = work / MINED
    if cached.is_file():
        return Dataset.from_json(str(cached))
    dataset = Dataset.from_list(pairs)
    if config.mine_negatives:
        candidates = len(dataset)
        dataset = mine_hard_negatives(
            dataset,
            model,
            anchor_column_name="anchor",
            positive_column_name="positive",
            range_min=config.mine_range_min,
            range_max=min(config.mine_range_max, max(candidates - 1, config.num_negatives)),
            relative_margin=config.mine_relative_margin,
            max_score=config.mine_max_score,
            num_negatives=config.num_negatives,
            sampling_strategy="top",
            output_format="n-tuple",
            batch_size=64,
            verbose=False,
        )
        dataset = fill_unmined(pairs, dataset, config.num_negatives, config.seed)
    work.mkdir(parents=True, exist_ok=True)
    dataset.to_json(str(cached))
    return dataset


def fill_unmined(pairs: list[dict[str, str]], mined, num_negatives: int, seed: int):
    """Pairs for which no candidate passed the guard come back with random passages as negatives (what
    in-batch negatives are anyway), so mining never shrinks the training set."""
    from datasets import Dataset

    if len(pairs) < 2:
        raise ValueError("the corpus gave fewer than two training pairs: too small to adapt on")
    rows = mined.to_list()
    kept = {row["anchor"] for row in rows}
    rng = random.Random(seed)
    positives = [pair["positive"] for pair in pairs]
    for pair in pairs:
        if pair["anchor"] in kept:
            continue
        others = [
            p for p in rng.sample(positives, min(len(positives), num_negatives + 1)) if p != pair["positive"]
        ]
        row = dict(pair)
        for number in range(num_negatives):
            row[f"negative_{number + 1}"] = others[number % len(others)]
        rows.append(row)
    rng.shuffle(rows)
    return Dataset.from_list(rows)


def text_columns(dataset) -> list[str]:
    return [c for c in dataset.column_names if c != "label"]


def teacher_embeddings(model, train, max_seq_length: int, work: Path) -> torch.Tensor:
    """The starting encoder's embeddings of every text of every row, ``(rows, columns, dim)`` in
    ``train``'s row and column order: the distillation targets. Each distinct text is embedded once, at
    the contrastive stage's window; cached in ``work/teacher.pt`` so a resume does not embed again."""
    cached = work / TEACHER
    if cached.is_file():
        return torch.load(cached)
    columns = text_columns(train)
    texts = sorted({row[c] for row in train for c in columns})
    window = model.max_seq_length
    model.max_seq_length = max_seq_length
    try:
        vectors = model.encode(texts, batch_size=64, convert_to_tensor=True, show_progress_bar=True).cpu()
    finally:
        model.max_seq_length = window
    position = {text: number for number, text in enumerate(texts)}
    rows = torch.tensor([[position[row[c]] for c in columns] for row in train])
    teacher = vectors[rows]
    work.mkdir(parents=True, exist_ok=True)
    torch.save(teacher, cached)
    return teacher


class DistilledRankingLoss(nn.Module):
    """MNRL plus ``weight`` times the mean squared distance of each text's embedding from the starting
    encoder's (``teacher[row]``; the row number arrives as the ``label`` column). For normalised
    embeddings the distance is 2(1 - cos).

    With a ``lexical`` teacher, MNRL's one-hot target becomes the hybrid teacher's distribution over the
    same in-batch candidates: softmax of the starting encoder's cosine plus ``lexical_weight`` times
    normalised BM25, at MNRL's scale (``lexical_teacher``)."""

    def __init__(
        self,
        model,
        teacher: torch.Tensor,
        weight: float,
        lexical: LexicalTeacher | None = None,
        lexical_weight: float = 0.0,
    ):
        super().__init__()
        self.model = model
        self.ranking = MultipleNegativesRankingLoss(model)
        self.teacher = teacher
        self.weight = weight
        self.lexical, self.lexical_weight = lexical, lexical_weight

    def forward(self, sentence_features, labels: torch.Tensor) -> torch.Tensor:
        embeddings = embed_columns(self.model, sentence_features)
        rows = labels.cpu()
        if self.lexical is None:
            loss = self.ranking.compute_loss_from_embeddings(embeddings, labels)
        else:
            loss = self.hybrid_ranking(embeddings, rows)
        if self.weight:
            student = torch.stack(embeddings, dim=1)
            target = self.teacher[rows].to(student)
            loss = loss + self.weight * (student - target).pow(2).sum(-1).mean()
        return loss

    def hybrid_ranking(self, embeddings: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the student's in-batch distribution against the hybrid teacher's."""
        scale = self.ranking.scale
        student = scale * cos_sim(embeddings[0], torch.cat(embeddings[1:]))
        starting = self.teacher[rows].to(student)  # (batch, columns, dim)
        passages = starting[:, 1:].transpose(0, 1).reshape(-1, starting.shape[-1])  # MNRL's order
        lexical = self.lexical.scores(rows.numpy()).to(student)
        target = scale * (cos_sim(starting[:, 0], passages) + self.lexical_weight * lexical)
        return -(target.softmax(-1) * student.log_softmax(-1)).sum(-1).mean()


class BudgetTrainer(SentenceTransformerTrainer):
    """The sentence-transformers trainer with the learning rate decaying to zero at the end of the
    wall-clock budget (the pre-training stage's schedule), since steps are what the clock allows."""

    def __init__(self, *args, time_box: ResumableTimeBox, warmup: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.time_box = time_box
        self.warmup = warmup

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = budget_schedule(optimizer or self.optimizer, self.warmup, self.time_box)
        return self.lr_scheduler


def run_contrastive(
    config: AdaptConfig,
    model,
    train,
    general,
    work: Path,
    minutes: float,
    state: RunState,
    teacher=None,
    lexical: LexicalTeacher | None = None,
    margins=None,
) -> dict:
    """Train ``model`` in place for ``minutes`` with MNRL (in-batch plus mined negatives), distilled toward
    ``teacher`` (``teacher_embeddings``) when given, and toward the hybrid teacher's ranking when ``lexical``
    is given too. ``margins`` (rows with a cross-encoder's margins, ``cross_teacher.score_rows``) add a
    MarginMSE dataset beside the corpus's, or replace it when ``config.teacher_mode`` is "instead"."""
    from datasets import Dataset

    stage_dir = work / "contrastive"
    if teacher is not None:
        ranking = DistilledRankingLoss(
            model, teacher, config.distill_weight, lexical, config.lexical_teacher_weight
        )
        loss = {"corpus": ranking}
        train = train.add_column("label", list(range(len(train))))
    else:
        loss = {"corpus": MultipleNegativesRankingLoss(model)}
    datasets = {"corpus": train}
    if margins is not None:
        datasets["teacher"] = margins
        loss["teacher"] = MarginMSELoss(model, similarity_fct=pairwise_cos_sim)  # the teacher's scale
        if config.teacher_mode == "instead":
            del datasets["corpus"], loss["corpus"]
    if general:
        datasets["general"] = Dataset.from_list(general)
        loss["general"] = MultipleNegativesRankingLoss(model)
    time_box = ResumableTimeBox(minutes, state, "contrastive")
    args = SentenceTransformerTrainingArguments(
        output_dir=str(stage_dir / "checkpoints"),
        per_device_train_batch_size=config.contrastive_batch_size,
        learning_rate=config.contrastive_learning_rate,
        max_steps=config.max_steps_per_stage or 1_000_000,  # else the clock stops it
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="steps",
        save_steps=25,
        save_total_limit=1,
        logging_steps=10,
        report_to="none",
        seed=config.seed,
        dataloader_drop_last=True,
    )
    trainer = BudgetTrainer(
        model=model,
        args=args,
        train_dataset=datasets if len(datasets) > 1 else next(iter(datasets.values())),
        loss=loss if len(datasets) > 1 else next(iter(loss.values())),
        callbacks=[time_box],
        time_box=time_box,
        warmup=config.warmup_steps,
    )
    result, seconds = train_resuming(trainer, time_box, stage_dir)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    record = {
        "rows": {name: len(d) for name, d in datasets.items()},
        "columns": text_columns(train),
        "losses": {name: type(value).__name__ for name, value in loss.items()},
        "steps": result.global_step,
        "seconds": round(seconds, 1),
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
    }
    log.info("contrastive stage: %s", record)
    return record
