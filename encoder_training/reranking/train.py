"""``cloze train reranker``: judged queries in, a sentence-transformers ``CrossEncoder`` folder out.

1. the judged queries (BEIR folder + split, or JSONL pairs + corpus), a few held out as a dev set;
2. an index of the corpus built with the bundled encoder (the service's own first stage) in ``OUT.work``,
   or an existing one (``--index``), searched in hybrid mode to mine hard negatives (``mining``);
3. the sentence-transformers cross-encoder trainer under a wall-clock budget with checkpoints (a rerun
   resumes), starting from any BERT-style folder (default: the bundled encoder's weights, new head);
4. the dev check: the held-out queries' first-stage top N reranked, nDCG@10 before and after, written into
   ``training.json`` and the model card (``README.md``).
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from encoder_runtime.model_dir import fingerprint, resolve_model_path
from encoder_training.adaptation.timing import ResumableTimeBox, RunState, train_resuming
from encoder_training.pretraining.train import budget_schedule
from encoder_training.reranking.config import LOSSES, RerankConfig
from encoder_training.reranking.judged import JudgedQuery, read_beir, read_pairs
from encoder_training.reranking.mining import MiningSettings, first_stage, mine_negatives, training_rows
from encoder_training.reranking.scoring import cross_encoder_scorer, mean_ndcg, rerank
from index.build.builder import BuildOptions, build_if_needed
from index.search_index import SearchIndex

log = logging.getLogger(__name__)
TRAINING_RECORD = "training.json"
MINED = "mined.json"
# Steps timed before training, after one that warms up (``estimate_epochs``).
PROBE_STEPS = 3
# Below this many epochs a budget is said up front to be likely too little: on SciFact 1.36 epochs still
# lowered the held-out queries' nDCG@10 (docs/design-decisions.md).
WARN_EPOCHS = 3.0


def mining_settings(config: RerankConfig) -> MiningSettings:
    return MiningSettings(config.num_negatives, config.range_min, config.range_max, config.relative_margin)


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".work")


def load_judged(config: RerankConfig, work: Path) -> tuple[list[JudgedQuery], Path]:
    if bool(config.beir) == bool(config.pairs):
        raise ValueError("give either a BEIR folder (--beir) or judged pairs (--pairs), not both")
    if config.beir:
        return read_beir(Path(config.beir), config.split)
    return read_pairs(Path(config.pairs or ""), Path(config.corpus) if config.corpus else None, work)


def split_dev(queries: list[JudgedQuery], dev_queries: int, seed: int) -> tuple[list[JudgedQuery], list]:
    """A seeded hold-out of queries whose positives have corpus ids (the dev check scores by id); at most a
    fifth of the queries, so a small set still trains on most of its judgements."""
    eligible = [q for q in queries if q.positive_ids()]
    count = min(dev_queries, len(queries) // 5, len(eligible))
    dev = random.Random(seed).sample(eligible, count) if count > 0 else []
    held = {q.query_id for q in dev}
    return [q for q in queries if q.query_id not in held], dev


def open_first_stage(config: RerankConfig, corpus: Path, work: Path, encoder: Any) -> SearchIndex:
    if config.index:
        return SearchIndex.open(Path(config.index), encoder, create=False, read_only=True)
    folder = work / "index"
    build_if_needed(
        folder, corpus, encoder, BuildOptions(show_progress=True, resume=True)
    )  # a killed run keeps its chunks
    return SearchIndex.open(folder, encoder, create=False)


def prepare(config: RerankConfig, work: Path) -> dict[str, Any]:
    """Mined training rows and the dev set's first-stage candidates, cached in ``work/mined.json`` (a resumed
    run trains on exactly the same rows)."""
    cached = work / MINED
    if cached.is_file():
        return json.loads(cached.read_text())
    from encoder_runtime import load_encoder

    queries, corpus = load_judged(config, work)
    train_queries, dev = split_dev(queries, config.dev_queries, config.seed)
    encoder = load_encoder(config.encoder or None, backend=config.backend)
    started = time.perf_counter()
    index = open_first_stage(config, corpus, work, encoder)
    try:
        index.wait_for_lexical()
        indexed = time.perf_counter()
        mined, stats = mine_negatives(train_queries, index, encoder, mining_settings(config))
        hits, _ = first_stage(index, encoder, [q.text for q in dev], config.dev_candidates)
    finally:
        index.close()
    prepared = {
        "rows": training_rows(mined, config.loss, config.seed),
        "dev": [
            {
                "query": q.text,
                "relevant": dict.fromkeys(q.positive_ids(), 1),
                "candidates": [[h.id, h.text] for h in h_],
            }
            for q, h_ in zip(dev, hits, strict=True)
        ],
        "record": {
            "corpus": str(corpus),
            "first_stage": {
                "encoder": encoder.info.model_id,
                "backend": encoder.backend.name,
                "mode": "hybrid",
            },
            "queries": len(queries),
            "train_queries": len(train_queries),
            "dev_queries": len(dev),
            "positives": sum(len(q.positives) for q in train_queries),
            "mining": stats,
            "index_seconds": round(indexed - started, 1),
            "mining_seconds": round(time.perf_counter() - indexed, 1),
        },
    }
    work.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(prepared))
    return prepared


def build_cross_encoder(model: str, max_length: int):
    """Any BERT-style folder (a sentence-transformers bi-encoder included) becomes a one-logit cross-encoder;
    a CrossEncoder folder loads as it is (further training)."""
    from sentence_transformers.cross_encoder import CrossEncoder

    return CrossEncoder(
        str(resolve_model_path(model)), num_labels=1, max_length=max_length, local_files_only=True
    )


def make_loss(name: str, model, rows: list[dict[str, Any]]):
    import torch
    from sentence_transformers.cross_encoder import losses

    if name == "bce":
        positives = sum(1 for row in rows if row["label"] > 0)
        weight = (len(rows) - positives) / max(
            1, positives
        )  # balance the classes, as ST's reranker recipe does
        return losses.BinaryCrossEntropyLoss(model, pos_weight=torch.tensor(max(1.0, weight)))
    if name == "mnrl":
        return losses.MultipleNegativesRankingLoss(model)
    raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")


def budget_trainer_class():
    from sentence_transformers.cross_encoder import CrossEncoderTrainer

    class BudgetCrossEncoderTrainer(CrossEncoderTrainer):
        """The learning rate decays to zero at the end of the wall-clock budget (``budget_schedule``)."""

        def __init__(self, *args, time_box: ResumableTimeBox, warmup: int, **kwargs):
            super().__init__(*args, **kwargs)
            self.time_box, self.warmup = time_box, warmup

        def create_scheduler(self, num_training_steps: int, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = budget_schedule(optimizer or self.optimizer, self.warmup, self.time_box)
            return self.lr_scheduler

    return BudgetCrossEncoderTrainer


def fit(
    config: RerankConfig, model, rows: list[dict[str, Any]], work: Path, state: RunState
) -> dict[str, Any]:
    from datasets import Dataset

    time_box = ResumableTimeBox(config.max_time_minutes, state, "train")
    args = training_arguments(config, work / "checkpoints")
    trainer = budget_trainer_class()(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        loss=make_loss(config.loss, model, rows),
        callbacks=[time_box],
        time_box=time_box,
        warmup=config.warmup_steps,
    )
    checkpoints = sorted((work / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    result, seconds = train_resuming(trainer, time_box, work)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "steps": result.global_step,
        "epochs": round(result.global_step * config.batch_size / len(rows), 2),
        "train_seconds": round(state.spent("train"), 1),
        "seconds_this_run": round(seconds, 1),
        "resumed_from": checkpoints[-1].name if checkpoints else None,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
    }


class BudgetTooSmall(ValueError):
    pass


def training_arguments(config: RerankConfig, output_dir: Path, **overrides: Any):
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments

    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": config.batch_size,
        "learning_rate": config.learning_rate,
        "max_steps": config.max_steps or 1_000_000,  # else the clock stops it
        "batch_sampler": BatchSamplers.NO_DUPLICATES
        if config.loss == "mnrl"
        else BatchSamplers.BATCH_SAMPLER,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": 1,
        "logging_steps": 10,
        "report_to": "none",
        "seed": config.seed,
    }
    return CrossEncoderTrainingArguments(**(settings | overrides))


def estimate_epochs(config: RerankConfig, model, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the budget buys, before training: ``PROBE_STEPS`` real steps (after one that warms up) timed on
    a copy of the model, and the epochs of ``rows`` the budget's steps make at that pace."""
    import copy
    import tempfile

    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoderTrainer
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    probe, clock = copy.deepcopy(model), StepClock()
    sample = rows[: config.batch_size * (PROBE_STEPS + 1)]
    with tempfile.TemporaryDirectory(prefix="rerank-probe-") as scratch:
        args = training_arguments(
            config, Path(scratch), max_steps=PROBE_STEPS + 1, save_strategy="no", logging_strategy="no",
            disable_tqdm=True,
        )  # fmt: skip
        trainer = CrossEncoderTrainer(
            model=probe,
            args=args,
            train_dataset=Dataset.from_list(sample),
            loss=make_loss(config.loss, probe, rows),
            callbacks=[clock],
        )
        trainer.train()
    step_seconds = (clock.ends[-1] - clock.ends[0]) / max(1, len(clock.ends) - 1)
    steps = int(config.max_time_minutes * 60 / max(step_seconds, 1e-9))
    if config.max_steps:
        steps = min(steps, config.max_steps)
    return {
        "step_seconds": round(step_seconds, 4),
        "steps": steps,
        "epochs": round(steps * config.batch_size / len(rows), 2),
        "minutes_per_epoch": round(len(rows) / config.batch_size * step_seconds / 60, 1),
    }


def budget_verdict(config: RerankConfig, estimate: dict[str, Any], rows: int) -> str | None:
    """None when the budget looks enough; a warning when it is thin; ``BudgetTooSmall`` when it buys fewer
    than ``config.min_epochs`` epochs and ``config.force`` is not set."""
    epochs = estimate["epochs"]
    bought = (
        f"the budget buys about {epochs} epochs of the {rows} training rows ({estimate['steps']} steps of "
        f"{estimate['step_seconds']} s here; one epoch takes about {estimate['minutes_per_epoch']} minutes)"
    )
    if epochs < config.min_epochs and not config.force:
        raise BudgetTooSmall(
            f"{bought}: too little to help (on SciFact 0.16 of an epoch halved nDCG@10 with the top 10 "
            f"reranked). Give --max-time-minutes {config.min_epochs * estimate['minutes_per_epoch']:.0f} or "
            "more, train on a GPU, or add --force to train anyway."
        )
    if epochs < WARN_EPOCHS:
        return f"{bought}: likely too little (on SciFact 1.36 epochs still lowered the dev queries' nDCG@10)"
    return None


def dev_check(model, dev: list[dict[str, Any]], depth: int) -> dict[str, Any]:
    """nDCG@10 of the held-out queries: the first stage's order, and its top ``depth`` reranked."""
    if not dev:
        return {}
    scorer = cross_encoder_scorer(model)
    relevant = {str(n): item["relevant"] for n, item in enumerate(dev)}
    before = {str(n): [doc for doc, _ in item["candidates"]] for n, item in enumerate(dev)}
    after = {str(n): rerank(scorer, item["query"], item["candidates"], depth) for n, item in enumerate(dev)}
    return {
        "queries": len(dev),
        "candidates": depth,
        "first_stage_ndcg@10": round(mean_ndcg(before, relevant), 4),
        "reranked_ndcg@10": round(mean_ndcg(after, relevant), 4),
    }


def dev_warning(dev: dict[str, Any]) -> str | None:
    """What to tell the user when reranking lowered the held-out queries' nDCG@10 (None when it did not)."""
    if not dev or dev["reranked_ndcg@10"] > dev["first_stage_ndcg@10"]:
        return None
    return (
        f"on {dev['queries']} held-out judged queries this reranker does not beat the first stage "
        f"(nDCG@10 {dev['first_stage_ndcg@10']} alone, {dev['reranked_ndcg@10']} with its top "
        f"{dev['candidates']} reranked): serving it would not improve search. Train longer "
        "(--max-time-minutes; a GPU does in minutes what a CPU does in hours) or start from a cross-encoder "
        "already trained on more judged queries (--model)."
    )


def train_reranker(config: RerankConfig) -> Path:
    """Train (or resume) and save ``config.out``; a folder that already holds a finished run is left as is."""
    out = Path(config.out)
    if (out / TRAINING_RECORD).is_file():
        log.info("%s already holds a trained reranker; nothing to do", out)
        return out
    work = work_dir(out)
    state = RunState(work)
    prepared = prepare(config, work)
    rows = prepared["rows"]
    if not rows:
        raise ValueError("no training rows: no judged query had a positive")
    model = build_cross_encoder(config.model, config.max_length)
    if not state.record("estimate"):  # a resumed run was judged when it started
        estimate = estimate_epochs(config, model, rows)
        if warning := budget_verdict(config, estimate, len(rows)):
            log.warning("cloze train reranker: %s", warning)
            estimate["warning"] = warning
        state.finish("estimate", estimate)
    training = fit(config, model, rows, work, state) | {"estimate": state.record("estimate")}
    started = time.perf_counter()
    dev = dev_check(model, prepared["dev"], config.dev_candidates)
    model.save(str(out))
    base = resolve_model_path(config.model)
    record = {
        "recipe": asdict(config),
        "base_model": str(base),
        "base_fingerprint": fingerprint(base),
        "data": prepared["record"],
        "rows": len(prepared["rows"]),
        "training": training,
        "dev": dev | ({"seconds": round(time.perf_counter() - started, 1)} if dev else {}),
    }
    (out / TRAINING_RECORD).write_text(json.dumps(record, indent=2))
    (out / "README.md").write_text(model_card(out, record))
    return out


def model_card(out: Path, record: dict[str, Any]) -> str:
    recipe, data, training, dev = record["recipe"], record["data"], record["training"], record["dev"]
    mining = data["mining"]
    lines = [
        f"# {out.name}",
        "",
        "A cross-encoder reranker (sentence-transformers `CrossEncoder`, one logit: higher is more relevant) "
        "trained by `cloze train reranker`.",
        "",
        "## Training",
        f"- start: `{record['base_model']}` (fingerprint `{record['base_fingerprint'][:12]}`), a new one-logit head",
        f"- judged queries: {data['queries']} from `{recipe['beir'] or recipe['pairs']}`"
        + (f" split `{recipe['split']}`" if recipe["beir"] else "")
        + f"; {data['train_queries']} trained on, {data['dev_queries']} held out as dev",
        f"- hard negatives: the first stage's hybrid top {recipe['range_max']} (`{data['first_stage']['encoder']}`, "
        f"{data['first_stage']['backend']}), up to {recipe['num_negatives']} a query; judged positives excluded "
        f"({mining['positives']}), {mining['guarded']} skipped by the false-negative guard (dense score above "
        f"{1 - recipe['relative_margin']:.2f} x the positive's), {mining['negatives']} kept",
        f"- loss `{recipe['loss']}`, {record['rows']} rows, batch {recipe['batch_size']}, lr {recipe['learning_rate']}, "
        f"max length {recipe['max_length']} tokens",
        f"- {training['steps']} steps ({training['epochs']} epochs) in {training['train_seconds']} s "
        f"(budget {recipe['max_time_minutes']} min); loss {training['first_loss']} -> {training['final_loss']}",
    ]
    if dev:
        lines += [
            "",
            "## Measured",
            f"Dev ({dev['queries']} held-out judged queries), nDCG@10: first stage alone "
            f"{dev['first_stage_ndcg@10']}, its top {dev['candidates']} reranked {dev['reranked_ndcg@10']}.",
        ]
        if warning := dev_warning(dev):
            lines += ["", f"**Not an improvement:** {warning}"]
    lines += [
        "",
        "## Use",
        "```python",
        "from sentence_transformers import CrossEncoder",
        f'model = CrossEncoder("{out}")',
        'scores = model.predict([("query", "passage one"), ("query", "passage two")])',
        "```",
        "",
        "Full details: `training.json`.",
        "",
    ]
    return "\n".join(lines)
