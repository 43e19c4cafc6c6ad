"""Named instants where the crash tests stop a process to SIGKILL it (or fill its disk) deterministically.

With ``CLOZE_INDEX_PAUSE_AT=<stage>[,<stage>...]`` the process writes the stage's name into
``CLOZE_INDEX_PAUSE_FILE`` the first time it reaches it and waits there up to ``CLOZE_INDEX_PAUSE_SECONDS``
(60), or until the test deletes the file (then it carries on; each stage pauses once per process).
With ``CLOZE_INDEX_PAUSE_ARMED_BY=<path>`` as well, a stage pauses only while that file exists (a test
arms the pause once the process is where it wants it, e.g. after the snapshot that replay makes at open).
Without the variables each call is one dictionary lookup.

Stages: ``ingest`` (after a build batch), ``rebuild`` (a service rebuild made its draft, about to fill it),
``publish`` (version complete, ``CURRENT`` not yet switched), ``swap`` (``CURRENT`` switched, the service
still on the old version), ``upsert`` (a write committed to SQLite, not yet in FAISS), ``snapshot-start``
(a FAISS snapshot about to be written), ``snapshot`` (its FAISS file renamed into place, its JSON not yet),
``backup`` (a backup's read transaction open, the writer's lock released, the store not yet copied:
``index.archive.snapshots``), ``backup-written`` (its archive complete under a temp name, not yet renamed),
``restore`` (a restored version complete on disk, not yet published), ``replication-<collection>`` (that
collection's shipper or follower thread, before each step: ``index.replication.worker``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_passed: set[str] = set()


def pause_for_tests(stage: str) -> None:
    wanted = os.environ.get("CLOZE_INDEX_PAUSE_AT")
    if not wanted or stage not in wanted.split(",") or stage in _passed:
        return
    armed_by = os.environ.get("CLOZE_INDEX_PAUSE_ARMED_BY")
    if armed_by and not Path(armed_by).exists():
        return
    _passed.add(stage)
    marker = os.environ.get("CLOZE_INDEX_PAUSE_FILE")
    deadline = time.monotonic() + float(os.environ.get("CLOZE_INDEX_PAUSE_SECONDS", "60"))
    if not marker:
        time.sleep(max(0.0, deadline - time.monotonic()))
        return
    path = Path(marker)
    path.write_text(stage)
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
