"""Where named data sets (STS-B, SNLI, LAMA, BEIR folders, ...) are looked for: ``--data-dir``, else
``CLOZE_DATA_DIR``, else ``../shared/data`` beside the checkout. A user's own files need no data folder."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    env = os.environ.get("CLOZE_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
