"""Where the default fill-mask model lives (all-MiniLM-L6-v2 has no MLM head).

Placeholder location until the project's own trained fill-mask model ships (issue 7): an MLM model
folder under ``app/models/fill-mask``.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "fill-mask"


def default_fill_mask_path() -> Path:
    if not (SHIPPED / "config.json").is_file():
        raise FileNotFoundError(
            f"no default fill-mask model at {SHIPPED}; set CLOZE_FILL_MASK_MODEL to an MLM model folder"
        )
    return SHIPPED
