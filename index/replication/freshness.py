"""How current a replica's copy is, measured against what the writer published: its heartbeat
(``e<epoch>/heartbeat.json``, about once a second: its position and the time on its clock). Hosts' clocks are
assumed in step (NTP): a heartbeat's age is this host's time minus the writer's."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

KEEP = 600  # heartbeats remembered: about ten minutes of the writer's


@dataclass(frozen=True)
class Beat:
    epoch: int
    version: int
    seq: int
    time: float  # the writer's clock


class WriterBeats:
    """The writer's heartbeats as a replica read them, oldest first (a tuple replaced whole: ``report`` runs in
    another thread)."""

    def __init__(self) -> None:
        self.beats: tuple[Beat, ...] = ()

    def saw(self, epoch: int, heartbeat: dict[str, Any] | None) -> None:
        if heartbeat is None:
            return
        beat = Beat(epoch, int(heartbeat["version"]), int(heartbeat["seq"]), float(heartbeat["time"]))
        if not self.beats or self.beats[-1] != beat:
            self.beats = (*self.beats[-(KEEP - 1) :], beat)

    def report(self, position: tuple[int, int, int] | None, bound: float) -> dict[str, Any]:
        """The writer's sequence, the lag behind it and the heartbeat's age; no lag from a heartbeat older
        than ``bound`` (the writer may be far ahead by now)."""
        beats, now = self.beats, time.time()
        latest = beats[-1] if beats else None
        age = None if latest is None else max(0.0, now - latest.time)
        lag = None
        if latest is not None and age is not None and age <= bound and position is not None:
            if (latest.epoch, latest.version) == position[:2]:
                lag = max(0, latest.seq - position[2])
        return {
            "writer_seq": None if latest is None else latest.seq,
            "lag": lag,
            "writer_heartbeat_age_s": None if age is None else round(age, 3),
        }
