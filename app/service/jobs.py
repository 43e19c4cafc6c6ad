"""Background jobs (index rebuilds): one at a time, in a worker thread, status kept in memory.

Job records do not survive a restart; the index they build does (it is published atomically). At shutdown
a running job is cancelled, not waited for: its progress callback raises ``JobCancelled`` at the job's
next report (a rebuild reports after every slice of chunks and before it publishes, and deletes its draft),
so SIGTERM does not wait for a rebuild to finish and does not publish one on the way down.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from app.service.errors import without_server_paths

log = logging.getLogger("cloze.service")


class JobCancelled(RuntimeError):
    """Raised from a job's progress report once the service is shutting down."""


@dataclass
class Job:
    job_id: str
    kind: str
    collection: str = "default"
    status: str = "queued"
    done: int = 0
    total: int = 0
    error: str | None = None
    manifest: dict[str, Any] | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def progress(self) -> float:
        if self.status == "succeeded":
            return 1.0
        return self.done / self.total if self.total else 0.0

    def report(self, done: int, total: int) -> None:
        if self.cancel.is_set():
            raise JobCancelled("the service is shutting down")
        if total:  # (0, 0): a heartbeat while the job reads its input
            self.done, self.total = done, total


@dataclass
class JobRegistry:
    """Finished jobs beyond the newest ``keep`` are forgotten (a loop of failing rebuilds grew it without end)."""

    keep: int = 100
    jobs: dict[str, Job] = field(default_factory=dict)
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="jobs")
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cancel: threading.Event = field(default_factory=threading.Event)

    def submit(
        self,
        kind: str,
        work: Callable[[Callable[[int, int], None]], dict[str, Any]],
        collection: str = "default",
    ) -> Job:
        job = Job(uuid.uuid4().hex[:12], kind, collection, cancel=self._cancel)
        with self._lock:
            self.jobs[job.job_id] = job
            finished = [j for j in self.jobs.values() if j.status in ("succeeded", "failed")]
            for old in finished[: max(0, len(finished) - self.keep)]:  # dicts keep insertion order
                del self.jobs[old.job_id]
        self._pool.submit(self._run, job, work)
        return job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def running(self, collection: str, kind: str = "rebuild") -> Job | None:
        """The queued or running job of this kind on this collection, if any."""
        return next(
            (
                job
                for job in list(self.jobs.values())
                if job.collection == collection and job.kind == kind and job.status in ("queued", "running")
            ),
            None,
        )

    def _run(self, job: Job, work: Callable[[Callable[[int, int], None]], dict[str, Any]]) -> None:
        job.status = "running"
        try:
            job.manifest = work(job.report)
            job.status = "succeeded"
        except JobCancelled as exc:
            log.info("job %s (%s) cancelled at shutdown", job.job_id, job.kind)
            job.error, job.status = f"{type(exc).__name__}: {exc}", "failed"
        except Exception as exc:  # the job's error is its result (less server paths; the log has them)
            log.warning("job %s (%s) failed", job.job_id, job.kind, exc_info=exc)
            job.error, job.status = without_server_paths(f"{type(exc).__name__}: {exc}"), "failed"

    def shutdown(self) -> None:
        """Cancel the running job (at its next progress report) and queued ones, then wait for the thread."""
        self._cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
