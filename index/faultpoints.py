"""Named instants where the crash tests stop a process to SIGKILL it (or fill its disk) deterministically.

With ``CLOZE_INDEX_PAUSE_AT=<stage>`` the process writes ``<stage>`` into ``CLOZE_INDEX_PAUSE_FILE`` when
it reaches that stage and waits there up to ``CLOZE_INDEX_PAUSE_SECONDS`` (60), or until the test deletes
the file (then it carries on). Without the variable each call is one dictionary lookup.

Stages: ``ingest`` (after each build batch), ``snapshot`` (FAISS bytes written, JSON not yet), ``publish``
(version complete, ``CURRENT`` not yet switched), ``swap`` (``CURRENT`` switched, the service still on the
old version), ``rebuild`` (a service rebuild has made its draft and is about to fill it), ``upsert``
(a write committed to SQLite, not yet applied to FAISS).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def pause_for_tests(stage: str) -> None:
    if os.environ.get("CLOZE_INDEX_PAUSE_AT") != stage:
        return
    marker = os.environ.get("CLOZE_INDEX_PAUSE_FILE")
    deadline = time.monotonic() + float(os.environ.get("CLOZE_INDEX_PAUSE_SECONDS", "60"))
    if not marker:
        time.sleep(max(0.0, deadline - time.monotonic()))
        return
    path = Path(marker)
    path.write_text(stage)
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
