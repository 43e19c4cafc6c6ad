"""SBERT siamese fine-tuning with the sentence-transformers trainer: any encoder folder in, a
sentence-transformers folder (encoder + pooling + normalisation) and a ``training.json`` record out.

The record is what the model card reports later (recipe, data, steps, wall time, dev scores), so
a folder can be exported and described without the command line that made it.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from encoder_runtime.model_dir import fingerprint, resolve_model_path
from encoder_training.finetuning.config import LOSSES, FinetuneConfig
from encoder_training.finetuning.data import Row, load_training_rows
from evaluation.sts import read_stsb

log = logging.getLogger(__name__)
TRAINING_RECORD = "training.json"


def build_model(model: str, pooling: str = "mean", normalize: bool = True, max_seq_length: int | None = None):
    """A sentence-transformers folder loads as it is; any other encoder gets pooling (+ L2 norm) added."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    path = resolve_model_path(model)
    if (path / "modules.json").is_file():
        st_model = SentenceTransformer(str(path), local_files_only=True)
    else:
        encoder = Transformer(str(path))
        modules = [encoder, Pooling(encoder.get_embedding_dimension(), pooling_mode=pooling)]
        st_model = SentenceTransformer(modules=modules + ([Normalize()] if normalize else []))
    if max_seq_length:
        st_model.max_seq_length = max_seq_length
    return st_model


def make_loss(name: str, model, matryoshka_dims: list[int], mini_batch_size: int = 16):
    from sentence_transformers.sentence_transformer import losses

    if name == "mnrl":
        loss = losses.MultipleNegativesRankingLoss(model)
    elif name == "cached-mnrl":
        loss = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini_batch_size)
    elif name == "cosine":
        loss = losses.CosineSimilarityLoss(model)
    elif name == "softmax":
        loss = losses.SoftmaxLoss(model, model.get_embedding_dimension(), num_labels=3)
    else:
        raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")
    return losses.MatryoshkaLoss(model, loss, matryoshka_dims) if matryoshka_dims else loss


def load_datasets(config: FinetuneConfig) -> dict[str, list[Row]]:
    data_dir = Path(config.data_dir)
    datasets = {}
    for source in config.sources():
        rows = load_training_rows(source, data_dir, config.columns, config.limit)
        if not rows:
            raise ValueError(f"pairs {source!r} gave no rows")
        datasets[Path(source).stem if Path(source).is_file() else source] = rows
    return datasets


def sts_dev_evaluator(data_dir: Path, limit: int | None):
    """STS-B dev Spearman during training: the model-selection signal SBERT uses."""
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    dev = read_stsb(data_dir, "dev", limit)
    return EmbeddingSimilarityEvaluator(
        dev.sentences1,
        dev.sentences2,
        [s / 5.0 for s in dev.scores],
        main_similarity="cosine",
        name="sts-dev",
    )


def finetune(config: FinetuneConfig) -> Path:
    """Train, save the sentence-transformers folder to ``config.out`` and write ``training.json``."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    out = Path(config.out)
    model = build_model(config.model, config.pooling, config.normalize, config.max_seq_length)
    rows = load_datasets(config)
    train = {name: Dataset.from_list(items) for name, items in rows.items()}
    evaluator = sts_dev_evaluator(Path(config.data_dir), config.eval_pairs) if _has_sts(config) else None
    in_batch = config.loss in ("mnrl", "cached-mnrl")
    scratch = tempfile.TemporaryDirectory(prefix="cloze-finetune-")
    args = SentenceTransformerTrainingArguments(
        output_dir=scratch.name,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_ratio,  # a float below 1 is a ratio in transformers 5
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        batch_sampler=BatchSamplers.NO_DUPLICATES if in_batch else BatchSamplers.BATCH_SAMPLER,
        eval_strategy="steps" if evaluator and config.eval_steps else "no",
        eval_steps=config.eval_steps or None,
        save_strategy="no",
        logging_steps=max(1, config.eval_steps or 50),
        report_to="none",
        seed=config.seed,
        dataloader_drop_last=in_batch,
        disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=train if len(train) > 1 else next(iter(train.values())),
        loss=make_loss(config.loss, model, config.matryoshka_dims, config.mini_batch_size),
        evaluator=evaluator,
    )
    started = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - started
    scratch.cleanup()
    final_dev = evaluator(model) if evaluator else {}
    model.save(str(out))
    stamp_legacy_pooling(out)
    write_record(out, config, rows, result.global_step, wall, trainer.state.log_history, final_dev)
    return out


def _has_sts(config: FinetuneConfig) -> bool:
    return (Path(config.data_dir) / "stsbenchmark" / "sts-dev.csv").is_file()


def stamp_legacy_pooling(out: Path) -> None:
    """Also write the ``pooling_mode_*`` booleans: older readers (and the runtime) look for those."""
    for module in json.loads((out / "modules.json").read_text()):
        if module.get("type", "").endswith("Pooling"):
            config_path = out / module["path"] / "config.json"
            config = json.loads(config_path.read_text())
            mode = config.get("pooling_mode")
            if isinstance(mode, str):
                for legacy in ("cls", "mean", "max"):
                    key = (
                        f"pooling_mode_{legacy}_token" if legacy == "cls" else f"pooling_mode_{legacy}_tokens"
                    )
                    config[key] = mode == legacy
                config_path.write_text(json.dumps(config, indent=2))


def write_record(
    out: Path, config: FinetuneConfig, rows: dict, steps: int, wall: float, history: list, final_dev: dict
) -> None:

    base = resolve_model_path(config.model)
    record = {
        "recipe": asdict(config),
        "base_model": str(base),
        "base_fingerprint": fingerprint(base),
        "data": {name: len(items) for name, items in rows.items()},
        "steps": steps,
        "wall_time_s": round(wall, 1),
        "sts_dev": {k: v for k, v in final_dev.items() if k.endswith("spearman_cosine")},
        "log_history": history,
    }
    (out / TRAINING_RECORD).write_text(json.dumps(record, indent=2, default=str))
    log.info("fine-tuned %s in %.0f s, %d steps -> %s", config.model, wall, steps, out)
