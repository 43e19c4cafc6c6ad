"""``adapt``: the stages in order under one wall-clock budget, resumable, ending in a sentence-transformers
folder that ``cloze export`` and ``cloze index build`` take as they take any other.

Order: read the corpus and make pairs, holding a slice out (``guard``); mine hard negatives with the
*starting* encoder (a good retriever already, unlike a half-adapted one); score the starting encoder on the
held-out pairs; with a cross-encoder ``--teacher``, its margins on the mined rows; MLM stage; contrastive
stage from the MLM stage's encoder; then the forgetting guard, a linear interpolation of the weights with
the starting model's (WiSE-FT; Wortsman et al. 2022), and the result check: the blend is kept only if it
beats the start on the held-out pairs, else the best other blend that does, else the starting weights.
The run's record is ``OUT/training.json`` (what ``cloze export`` puts on the model card). Work files live in ``OUT.work`` (checkpoints, mined pairs, ``state.json``): running
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
from encoder_training.adaptation import cross_teacher, guard
from encoder_training.adaptation.contrastive import (
    fit_estimate,
    mine,
    run_contrastive,
    sample_pairs,
    teacher_embeddings,
    text_columns,
)
from encoder_training.adaptation.corpus import make_pairs, read_passages
from encoder_training.adaptation.lexical_teacher import LexicalTeacher
from encoder_training.adaptation.mlm import run_mlm
from encoder_training.adaptation.recipe import AdaptConfig
from encoder_training.adaptation.timing import RunState
from encoder_training.finetuning.data import load_training_rows
from encoder_training.finetuning.train import stamp_legacy_pooling
from evaluation.data_folder import default_data_dir

log = logging.getLogger(__name__)
STAGES = ("mlm", "contrastive")
RECORD = "training.json"  # the record `cloze train finetune` writes: `cloze export` puts it on the model card
GUARD_JUDGEMENTS = "guard_judgements.json"  # the teacher's grades of the held-out candidates
SAVE_RESERVE_S = 20.0  # loading, interpolating and saving after the last stage (at most 5% of the budget)


def work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".work")


def interpolate(adapted, start_dir: Path, weight: float) -> None:
    """``adapted`` <- ``weight`` * adapted + (1 - ``weight``) * start, tensor by tensor (in place)."""
    from sentence_transformers import SentenceTransformer

    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"interpolation weight must be in [0, 1], not {weight}")
    if weight == 1.0:
        return
    start = SentenceTransformer(str(start_dir), local_files_only=True, device="cpu").state_dict()
    adapted.load_state_dict(guard.blend_states(start, adapted.state_dict(), weight))


def save_blended(adapted, start_dir: Path, weight: float, out: Path) -> None:
    """The forgetting guard's last step: ``adapted`` interpolated toward ``start_dir`` at ``weight``, saved as
    a sentence-transformers folder ``cloze export`` and ``cloze index build`` take."""
    interpolate(adapted, start_dir, weight)
    save(adapted, out)


def save(model, out: Path) -> None:
    model.save(str(out))
    stamp_legacy_pooling(out)


def copy_start(start: Path, out: Path) -> None:
    """The starting model's own files, byte for byte: the same fingerprint, so an index built with the start
    stays valid for the result (its ONNX exports and model card stay behind: they describe the start)."""
    shutil.copytree(
        start, out, ignore=shutil.ignore_patterns("onnx", "README.md", ".git*"), dirs_exist_ok=True
    )


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
    if not 0.0 <= config.interpolate <= 1.0:
        raise ValueError(f"--interpolate must be in [0, 1], not {config.interpolate}")
    if config.guard_pairs < 0 or not all(0.0 < w <= 1.0 for w in config.guard_alphas):
        raise ValueError("--guard-pairs must be zero (off) or positive, --guard-alphas each in (0, 1]")
    if config.teacher_mode not in cross_teacher.MODES:
        raise ValueError(f"--teacher-mode must be one of {', '.join(cross_teacher.MODES)}")
    if config.teacher and "contrastive" not in config.stages:
        raise ValueError("--teacher trains the contrastive stage: keep it in --stages")
    if not 0.0 < config.teacher_fraction < 1.0:
        raise ValueError("--teacher-fraction must be in (0, 1)")
    if not 0.0 < config.prep_fraction < 1.0:
        raise ValueError("--prep-fraction must be in (0, 1)")


def pairs_within(seconds: float, model, pairs: list[dict[str, str]], config, state: RunState, targets: bool):
    """The pairs whose mining and targets fit in ``seconds`` (``fit_estimate``), decided once a run, so a
    resume mines the same ones."""
    if not state.is_done("fit"):
        state.finish("fit", fit_estimate(model, pairs, config, seconds, targets))
    return sample_pairs(pairs, state.record("fit")["kept"], config.seed)


def start_check(model, held: guard.HeldOut, cross, config: AdaptConfig, work: Path, state: RunState) -> dict:
    """The starting encoder's held-out scores (and, with a cross-encoder, the teacher's grades of each
    held-out anchor's candidates, kept in ``work`` for a resume); ``eval_seconds`` sizes the final check."""
    judgements = work / GUARD_JUDGEMENTS
    if state.is_done("guard_start"):
        if judgements.is_file():
            held.candidates, held.grades = json.loads(judgements.read_text())
        return state.record("guard_start")
    began = time.perf_counter()
    sims = guard.similarities(model, held, config.max_seq_length)
    eval_seconds = time.perf_counter() - began
    if cross is not None:
        guard.judge(held, sims, cross)
        work.mkdir(parents=True, exist_ok=True)
        judgements.write_text(json.dumps([held.candidates, held.grades]))
    score = guard.score_from(sims, held)
    return state.finish_timed(
        "guard_start",
        time.perf_counter() - began,
        lambda spent: {"score": score, "eval_seconds": round(eval_seconds, 2), "seconds": round(spent, 1)},
    )


def guard_reserve(config: AdaptConfig, start: dict | None) -> float:
    """Seconds the final check may take: one held-out scoring per blend it may try, with a margin."""
    if not start:
        return 0.0
    evaluations = 1 + len(set(config.guard_alphas) - {config.interpolate})
    return 1.25 * evaluations * start["eval_seconds"]


def teacher_margins(cross, train, config: AdaptConfig, budget: float, work: Path, state: RunState):
    """The cross-encoder's margins on as many training rows as its share of the budget allows."""
    if state.is_done("cross_teacher"):
        return cross_teacher.score_rows(cross, train, 0.0, work)  # the cached rows
    began = time.perf_counter()
    scored = cross_teacher.score_rows(cross, train, config.teacher_fraction * budget, work)
    state.finish_timed(
        "cross_teacher",
        time.perf_counter() - began,
        lambda spent: cross_teacher.record(scored, len(train), spent),
    )
    return scored


def final_check(model, start: Path, held: guard.HeldOut | None, start_score: dict | None, config, out: Path):
    """Save what the check keeps (the configured blend when there is no check); returns its record."""
    from sentence_transformers import SentenceTransformer

    if held is None or start_score is None:
        save_blended(model, start, config.interpolate, out)
        reason = "--guard-pairs 0" if config.guard_pairs == 0 else "too few pairs to hold any out"
        return {"decision": None, "reason": reason, "alpha": config.interpolate}
    began = time.perf_counter()
    start_state = SentenceTransformer(
        str(start), local_files_only=True, device=str(model.device)
    ).state_dict()
    check = guard.choose(model, start_state, held, start_score["score"], config)
    if check["decision"] == "start":
        copy_start(start, out)
    else:
        save(model, out)
    check["seconds"] = round(time.perf_counter() - began, 1)
    (log.info if check["decision"] == "adapted" else log.warning)(guard.sentence(check))
    return check


def adapt(config: AdaptConfig, keep_work: bool = False) -> Path:
    """Run the recipe; returns the output folder (with ``training.json``: recipe, stage records, times, and
    ``guard``, the result check)."""
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
    pairs = make_pairs(passages, config.pair_kinds, config.pair_rounds, config.keep_sentence, config.seed)
    pairs, held = guard.hold_out(pairs, config.guard_pairs, config.seed)  # never trained on
    teacher = lexical = margins = None
    if "contrastive" in config.stages:
        mine_started = started  # reading the corpus counts too
        margins_alone = bool(config.teacher) and config.teacher_mode == "instead"  # no MNRL to distil into
        targets = bool(config.distill_weight or config.lexical_teacher_weight) and not margins_alone
        if not state.is_done("mine"):
            allowed = config.prep_fraction * budget - (time.perf_counter() - started)
            pairs = pairs_within(allowed, model, pairs, config, state, targets)
        if state.is_done("fit"):
            records["fit"] = state.record("fit")
        train = mine(config, model, pairs, work)
        records["mine"] = state.finish_timed(
            "mine", time.perf_counter() - mine_started, lambda spent: mine_record(pairs, train, spent)
        )
        if targets:
            # the starting encoder's embeddings, timed
            teacher_started = time.perf_counter()
            teacher = teacher_embeddings(model, train, config.max_seq_length, work)
            if config.lexical_teacher_weight:
                lexical = LexicalTeacher(train, text_columns(train))
            records["teacher"] = state.finish_timed(
                "teacher", time.perf_counter() - teacher_started, lambda spent: teacher_record(teacher, spent)
            )
    cross = cross_teacher.load_teacher(config.teacher, config.max_seq_length) if config.teacher else None
    start_score = start_check(model, held, cross, config, work, state) if held is not None else None
    if start_score:
        records["guard_start"] = start_score
    if cross is not None:
        margins = teacher_margins(cross, train, config, budget, work, state)
        records["cross_teacher"] = state.record("cross_teacher")
    reserve += guard_reserve(config, start_score)

    current = start
    if "mlm" in config.stages:
        mlm_out = work / "mlm" / "model"
        if not state.is_done("mlm"):
            minutes = (
                config.mlm_fraction * budget / 60
                if "contrastive" in config.stages
                else (budget - state.total_spent() - reserve) / 60
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
            record = run_contrastive(
                config, model, train, general, work, left / 60, state, teacher, lexical, margins
            )
            model.save(str(work / "contrastive" / "model"))
            state.finish("contrastive", record)
        else:
            model = SentenceTransformer(str(work / "contrastive" / "model"), local_files_only=True)
            model.max_seq_length = config.max_seq_length
        records["contrastive"] = state.record("contrastive")

    check = final_check(model, start, held, start_score, config, out)
    record = {
        "trained_with": "cloze adapt",
        "recipe": asdict(config),
        "base_model": str(start),
        "base_fingerprint": fingerprint(start),
        "data": {
            "documents": len(passages),
            "pairs": records.get("mine", {}).get("rows", 0),
            "held_out_pairs": len(held.queries) if held else 0,
        },
        "steps": {stage: records[stage]["steps"] for stage in STAGES if stage in records},
        "stages": records,
        "guard": check,
        "seconds_spent": {k: round(v, 1) for k, v in state.data["spent"].items()},
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    (out / RECORD).write_text(json.dumps(record, indent=2, default=str))
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    log.info("adapted %s on %d documents -> %s", start, len(passages), out)
    return out
