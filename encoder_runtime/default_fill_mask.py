"""The default fill-mask model: the bundled all-MiniLM-L6-v2 plus a small trained delta.

all-MiniLM-L6-v2 has no MLM head. This project trained one (``cloze train pretrain --init-from ...
--train-top-layers 6``): all six encoder layers and the MLM head transform moved, the embeddings (tied to the
output layer) stayed. Only the moved tensors ship, in fp16, under ``encoder_runtime/models/fill-mask-delta``;
the full ``BertForMaskedLM`` folder is assembled from the bundled model at first use into a cache directory
keyed by the delta's content, so it is built once. The embedding model itself is never changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from encoder_runtime.model_dir import bundled_model_path, fingerprint

DELTA_DIR = Path(__file__).resolve().parent / "models" / "fill-mask-delta"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MODEL_ID = "cloze-search/minilm-l6-fill-mask"


def default_fill_mask_path() -> Path:
    """An MLM folder that ``AutoModelForMaskedLM`` and ``AutoTokenizer`` load (assembled if needed)."""
    if not (DELTA_DIR / "delta.safetensors").is_file():
        raise FileNotFoundError(
            f"no fill-mask delta at {DELTA_DIR}; set CLOZE_FILL_MASK_MODEL to an MLM model folder"
        )
    target = _cache_root() / _delta_key()
    if not (target / "model.safetensors").is_file():
        assemble(target)
    return target


def _delta_key() -> str:
    digest = hashlib.sha256()
    for name in ("delta.safetensors", "manifest.json"):
        digest.update((DELTA_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def _cache_root() -> Path:
    """``$CLOZE_CACHE_DIR`` or ``~/.cache/cloze-search``, else the temp dir when home is read-only."""
    for root in (os.environ.get("CLOZE_CACHE_DIR"), Path.home() / ".cache" / "cloze-search"):
        if not root:
            continue
        path = Path(root) / "fill-mask"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return path
    path = Path(tempfile.gettempdir()) / "cloze-search" / "fill-mask"
    path.mkdir(parents=True, exist_ok=True)
    return path


def assemble(target: Path, delta_dir: Path = DELTA_DIR) -> None:
    """Base weights with a ``bert.`` prefix, the delta on top, the base tokenizer; atomic rename. Another
    ``delta_dir`` assembles a candidate delta the same way (a training run's, to compare with the shipped)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    base = bundled_model_path()
    manifest = json.loads((delta_dir / "manifest.json").read_text())
    if manifest["base_fingerprint"] != fingerprint(base):
        raise RuntimeError(f"the fill-mask delta was trained over another base model than {base}")
    state = {
        f"bert.{key}": value
        for key, value in load_file(str(base / "model.safetensors")).items()
        if not key.startswith("pooler.") and not key.endswith("position_ids")
    }
    state.update(
        {
            key: value.astype(np.float32)
            for key, value in load_file(str(delta_dir / "delta.safetensors")).items()
        }
    )
    config = json.loads((base / "config.json").read_text())
    config.update(architectures=["BertForMaskedLM"], tie_word_embeddings=True, _name_or_path=MODEL_ID)
    staging = Path(tempfile.mkdtemp(prefix=".assemble-", dir=target.parent))
    try:
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        (staging / "card.json").write_text(json.dumps({"model_id": MODEL_ID, **manifest}, indent=2))
        for name in TOKENIZER_FILES:
            if (base / name).is_file():
                shutil.copy2(base / name, staging / name)
        try:
            staging.rename(target)
        except OSError:  # another process assembled it first
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
