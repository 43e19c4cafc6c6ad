"""How current a replica's copy is, measured against what the writer published: its heartbeat
(``e<epoch>/heartbeat.json``, about once a second: its position and the time on its clock). A replica is as
stale as the newest heartbeat whose position it holds is old: it holds everything the writer had then, and
maybe more. Hosts' clocks are assumed in step (NTP): an age is this host's time minus the writer's."""

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

    def held_at(self, position: tuple[int, int, int]) -> bool:
        """Whether a replica at ``position`` (epoch, version, sequence) holds what the writer held then."""
        return (self.epoch, self.version, self.seq) <= position


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

    def report(
        self, position: tuple[int, int, int] | None, bound: float, stuck: bool = False
    ) -> dict[str, Any]:
        """The writer's sequence, the lag behind it and the heartbeat's age; how stale the replica is and
        whether that is over ``bound``. No lag from a heartbeat older than ``bound``: the writer may be far
        ahead by now. Stale when unknown (no heartbeat held yet) or ``stuck`` (the replica knows it cannot
        reach what the bucket holds)."""
        beats, now = self.beats, time.time()
        latest = beats[-1] if beats else None
        age = None if latest is None else max(0.0, now - latest.time)
        lag = None
        if latest is not None and age is not None and age <= bound and position is not None:
            if (latest.epoch, latest.version) == position[:2]:
                lag = max(0, latest.seq - position[2])
        held = next((beat for beat in reversed(beats) if position and beat.held_at(position)), None)
        staleness = None if held is None else max(0.0, now - held.time)
        return {
            "writer_seq": None if latest is None else latest.seq,
            "lag": lag,
            "writer_heartbeat_age_s": None if age is None else round(age, 3),
            "staleness_s": None if staleness is None else round(staleness, 3),
            "stale": stuck or staleness is None or staleness > bound,
        }
