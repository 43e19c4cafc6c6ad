"""The thread a writer's shipper and a replica's follower run in, replaceable by a watchdog: it beats at every
step; a thread the watchdog gave up on finds its generation stale when it wakes and ends, touching nothing."""

from __future__ import annotations

import logging
import threading
import time

from index.collections import DEFAULT_COLLECTION
from index.faultpoints import pause_for_tests
from index.replication.bucket import BucketUnavailable

log = logging.getLogger(__name__)


class Stuck(RuntimeError):
    """A step that cannot go on for a reason it states (a replica's tail with a gap): a state to report and
    log when it changes, not a failure to trace."""


class Worker:
    def __init__(self, interval: float, collection: str = DEFAULT_COLLECTION):
        self.interval, self.collection = interval, collection
        self.beat = time.monotonic()
        self.error: str | None = None
        self.stuck = False  # the last step stopped on a ``Stuck``: behind, whatever the heartbeats say
        self.restarts = 0
        self.lock = threading.Lock()  # held by a step that changes the index or the bucket
        self._generation = 0
        self._stop = threading.Event()
        self._kick = threading.Event()

    def step(self, generation: int) -> None:
        raise NotImplementedError

    def stage(self) -> str:
        """Its crash-test pause point (``index.faultpoints``): a test freezes one collection's thread alone."""
        return f"replication-{self.collection}"

    def start(self) -> None:
        self._generation += 1
        name = f"{type(self).__name__.lower()}-{self._generation}"
        threading.Thread(target=self._run, args=(self._generation,), name=name, daemon=True).start()

    def restart(self, why: str) -> None:
        """Give up on the running thread (it may be stuck in a call) and start another."""
        log.error("%s: %s; starting a new thread", type(self).__name__, why)
        self.restarts += 1
        self.beat = time.monotonic()
        self.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()

    def kick(self) -> None:
        """Step now rather than at the next interval (a write to ship)."""
        self._kick.set()

    @property
    def kicked(self) -> bool:
        """A kick is waiting for the next step."""
        return self._kick.is_set()

    def live(self, generation: int) -> bool:
        return generation == self._generation and not self._stop.is_set()

    def alive(self, *_: object) -> None:
        """A beat from inside a long step (an upload's or download's progress), so the watchdog waits."""
        self.beat = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.beat

    def _run(self, generation: int) -> None:
        while self.live(generation):
            self.beat = time.monotonic()
            pause_for_tests(self.stage())
            if not self.live(generation):
                return
            self._kick.clear()  # before the step: a kick that lands during it makes the next wait return at once
            try:
                self.step(generation)
                self.error, self.stuck = None, False
            except BucketUnavailable as exc:
                if self.error != str(exc):
                    log.warning("%s: the bucket is unavailable: %s", type(self).__name__, exc)
                self.error = str(exc)
            except Stuck as exc:
                if self.error != str(exc):
                    log.warning("%s: %s", type(self).__name__, exc)
                self.error, self.stuck = str(exc), True
            except Exception as exc:  # logged and retried: the thread must outlive any one failure
                error = f"{type(exc).__name__}: {exc}"
                if self.error != error:  # once, not every poll: a worker stuck on one failure filled the log
                    log.exception("%s step failed", type(self).__name__)
                self.error = error
            self._kick.wait(self.interval)
