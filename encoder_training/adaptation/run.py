"""``adapt``: the stages in order under one wall-clock budget, resumable, ending in a sentence-transformers
folder that ``cloze export`` and ``cloze index build`` take as they take any other.

Order: read the corpus and make pairs; mine hard negatives with the *starting* encoder (a good
retriever already, unlike a half-adapted one); MLM stage; contrastive stage from the MLM stage's
encoder; then the forgetting guard, a linear interpolation of the weights with the starting model's
(WiSE-FT; Wortsman et al. 2022). The run's record is ``OUT/training.json`` (what ``cloze export`` puts on
the model card). Work files live in ``OUT.work`` (checkpoints, mined pairs, ``state.json``): running
the same command again resumes there; they are removed on success unless ``keep_work``.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from encoder_runtime.model_dir import fingerprint, resolve_model_path
from encoder_training.adaptation.contrastive import mine, run_contrastive, teacher_embeddings, text_columns
from encoder_training.adaptation.corpus import make_pairs, read_passages
from encoder_training.adaptation.lexical_teacher import LexicalTeacher
from encoder_training.adaptation.mlm import run_mlm
from encoder_training.adaptation.recipe import AdaptConfig
from encoder_training.adaptation.timing import RunState
from encoder_training.data_folder import default_data_dir
from encoder_training.finetuning.data import load_training_rows
from encoder_training.finetuning.train import stamp_legacy_pooling

log = logging.getLogger(__name__)
STAGES = ("mlm", "contrastive")
RECORD = "training.json"  # the record `cloze train finetune` writes: `cloze export` puts it on the model card
SAVE_RESERVE_S = 20.0  # loading, interpolating and saving after the last stage (at most 5% of the budget)


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".work")


def interpolate(adapted, start_dir: Path, weight: float) -> None:
    """``adapted`` <- ``weight`` * adapted + (1 - ``weight``) * start, tensor by tensor (in place)."""
    import torch
    from sentence_transformers import SentenceTransformer

    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"interpolation weight must be in [0, 1], not {weight}")
    if weight == 1.0:
        return
    start = SentenceTransformer(str(start_dir), local_files_only=True, device="cpu").state_dict()
    blended = {}
    for key, value in adapted.state_dict().items():
        if key not in start or start[key].shape != value.shape:
            raise ValueError(f"cannot interpolate {key}: the starting model has no tensor of that shape")
        blended[key] = torch.lerp(start[key], value, weight) if value.is_floating_point() else value
    adapted.load_state_dict(blended)


def save_blended(adapted, start_dir: Path, weight: float, out: Path) -> None:
    """The forgetting guard's last step: ``adapted`` interpolated toward ``start_dir`` at ``weight``, saved as
    a sentence-transformers folder ``cloze export`` and ``cloze index build`` take."""
    interpolate(adapted, start_dir, weight)
    adapted.save(str(out))
    stamp_legacy_pooling(out)


def mine_record(pairs: list[dict[str, str]], train, seconds: float) -> dict:
    columns = [c for c in train.column_names if c.startswith("negative")]
    return {
        "pairs": len(pairs),
        "rows": len(train),
        "negative_columns": len(columns),
        "seconds": round(seconds, 1),
    }


def teacher_record(teacher, seconds: float) -> dict:
    rows, columns, _ = teacher.shape
    return {"rows": rows, "columns": columns, "seconds": round(seconds, 1)}


def validate(config: AdaptConfig) -> None:
    unknown = set(config.stages) - set(STAGES)
    if unknown or not config.stages:
        raise ValueError(f"stages must be among {', '.join(STAGES)}, not {sorted(unknown) or 'none'}")
    if config.max_time_minutes <= 0:
        raise ValueError("--max-time-minutes must be positive")
    if not 0.0 < config.mlm_fraction < 1.0:
        raise ValueError("--mlm-fraction must be in (0, 1)")
    if config.distill_weight < 0:
        raise ValueError("--distill-weight must be zero (off) or positive")
    if config.lexical_teacher_weight < 0:
        raise ValueError("--lexical-teacher-weight must be zero (off) or positive")
    if not config.out:
        raise ValueError("--out is required")


def adapt(config: AdaptConfig, keep_work: bool = False) -> Path:
    """Run the recipe; returns the output folder (with ``training.json``: recipe, stage records, times)."""
    from sentence_transformers import SentenceTransformer

    validate(config)
    started = time.perf_counter()
    out = Path(config.out)
    work = work_dir(out)
    state = RunState(work)
    budget = config.max_time_minutes * 60
    reserve = min(SAVE_RESERVE_S, 0.05 * budget)
    start = resolve_model_path(config.model)
    passages = read_passages(config.corpus, config.max_documents)
    records: dict = {"documents": len(passages)}

    model = SentenceTransformer(str(start), local_files_only=True)
    model.max_seq_length = config.mine_max_seq_length
    teacher = lexical = None
    if "contrastive" in config.stages:
        mine_started = started  # reading the corpus counts too
        pairs = make_pairs(passages, config.pair_kinds, config.pair_rounds, config.keep_sentence, config.seed)
        train = mine(config, model, pairs, work)
        records["mine"] = state.finish_timed(
            "mine", time.perf_counter() - mine_started, lambda spent: mine_record(pairs, train, spent)
        )
        if config.distill_weight or config.lexical_teacher_weight:  # the starting encoder's embeddings, timed
            teacher_started = time.perf_counter()
            teacher = teacher_embeddings(model, train, config.max_seq_length, work)
            if config.lexical_teacher_weight:
                lexical = LexicalTeacher(train, text_columns(train))
            records["teacher"] = state.finish_timed(
                "teacher", time.perf_counter() - teacher_started, lambda spent: teacher_record(teacher, spent)
            )

    current = start
    if "mlm" in config.stages:
        mlm_out = work / "mlm" / "model"
        if not state.is_done("mlm"):
            minutes = (
                config.mlm_fraction * budget / 60
                if "contrastive" in config.stages
                else (budget - reserve) / 60
            )
            _, record = run_mlm(config, start, [p.text for p in passages], work, minutes, state)
            state.finish("mlm", record)
        records["mlm"] = state.record("mlm")
        current = mlm_out

    model = SentenceTransformer(str(current), local_files_only=True)
    model.max_seq_length = config.max_seq_length
    if "contrastive" in config.stages:
        if not state.is_done("contrastive"):
            left = budget - state.total_spent() + state.spent("contrastive") - reserve
            if left <= 5:
                raise ValueError(
                    f"no time left for the contrastive stage ({left:.0f} s); raise --max-time-minutes"
                )
            data_dir = default_data_dir()
            general = [row for source in config.general_pairs for row in load_training_rows(source, data_dir)]
            record = run_contrastive(config, model, train, general, work, left / 60, state, teacher, lexical)
            model.save(str(work / "contrastive" / "model"))
            state.finish("contrastive", record)
        else:
            model = SentenceTransformer(str(work / "contrastive" / "model"), local_files_only=True)
            model.max_seq_length = config.max_seq_length
        records["contrastive"] = state.record("contrastive")

    save_blended(model, start, config.interpolate, out)
    record = {
        "trained_with": "cloze adapt",
        "recipe": asdict(config),
        "base_model": str(start),
        "base_fingerprint": fingerprint(start),
        "data": {"documents": len(passages), "pairs": records.get("mine", {}).get("rows", 0)},
        "steps": {stage: records[stage]["steps"] for stage in STAGES if stage in records},
        "stages": records,
        "seconds_spent": {k: round(v, 1) for k, v in state.data["spent"].items()},
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    (out / RECORD).write_text(json.dumps(record, indent=2, default=str))
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    log.info("adapted %s on %d documents -> %s", start, len(passages), out)
    return out
