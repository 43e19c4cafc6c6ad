"""The run's clock: one budget split over the stages, kept across resumes in ``state.json``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers.trainer_callback import ProgressCallback

from encoder_training.pretraining.train import TimeBox, TimeBoxProgress


class RunState:
    """``OUT/work/state.json``: seconds spent per stage and the stages finished (what resume reads)."""

    def __init__(self, work: Path):
        self.path = work / "state.json"
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"spent": {}, "done": []}

    def spent(self, stage: str) -> float:
        return float(self.data["spent"].get(stage, 0.0))

    def total_spent(self) -> float:
        return sum(float(v) for v in self.data["spent"].values())

    def add(self, stage: str, seconds: float) -> None:
        self.data["spent"][stage] = self.spent(stage) + seconds
        self.save()

    def set_spent(self, stage: str, seconds: float) -> None:
        self.data["spent"][stage] = seconds
        self.save()

    def is_done(self, stage: str) -> bool:
        return stage in self.data["done"]

    def finish(self, stage: str, record: dict | None = None) -> None:
        if stage not in self.data["done"]:
            self.data["done"].append(stage)
        self.data.setdefault("records", {})[stage] = record or {}
        self.save()

    def finish_timed(self, stage: str, seconds: float, record: Callable[[float], dict]) -> dict:
        """Count ``seconds`` to ``stage`` and finish it with ``record(total seconds)``, unless a resumed run
        finished it already; returns the stage's record either way."""
        if not self.is_done(stage):
            self.add(stage, seconds)
            self.finish(stage, record(self.spent(stage)))
        return self.record(stage)

    def record(self, stage: str) -> dict:
        return self.data.get("records", {}).get(stage, {})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2))


class ResumableTimeBox(TimeBox):
    """A ``TimeBox`` that starts with ``already`` seconds used (a resumed stage keeps its budget and its
    learning-rate decay), and writes the time used to the run state at every checkpoint."""

    def __init__(self, minutes: float, state: RunState, stage: str):
        super().__init__(minutes)
        self.state = state
        self.stage = stage
        self.already = state.spent(stage)

    def fraction_used(self) -> float:
        if self.started is None:
            return min(1.0, self.already / self.budget)
        return min(1.0, (self.already + time.perf_counter() - self.started) / self.budget)

    def seconds_used(self) -> float:
        return self.already + (time.perf_counter() - self.started if self.started is not None else 0.0)

    def on_save(self, args, state, control, **kwargs):
        self.state.set_spent(self.stage, self.seconds_used())

    def on_train_end(self, args, state, control, **kwargs):
        self.state.set_spent(self.stage, self.seconds_used())


def train_resuming(trainer: Any, time_box: TimeBox, stage_dir: Path) -> tuple[Any, float]:
    """Run a stage's trainer under its time box, from the stage's newest checkpoint when one exists, with
    a progress bar that counts the budget; returns the trainer's result and the seconds it took."""
    if trainer.pop_callback(ProgressCallback):
        trainer.add_callback(TimeBoxProgress(time_box))
    checkpoints = sorted(
        (stage_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])
    )
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(checkpoints[-1]) if checkpoints else None)
    return result, time.perf_counter() - started
