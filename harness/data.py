"""Where the repository and the real data sets (../shared/data beside the checkout) are."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CLOZE_DATA_DIR", ROOT.parent / "shared" / "data"))
