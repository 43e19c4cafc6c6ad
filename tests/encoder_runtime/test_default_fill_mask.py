"""The shipped default fill-mask model: a trained delta over the bundled encoder, assembled at first use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from encoder_runtime import default_fill_mask as dfm


@pytest.fixture(scope="module")
def assembled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLOZE_CACHE_DIR", str(cache))
        path = dfm.default_fill_mask_path()
    assert path.is_relative_to(cache)
    return path


def test_delta_leaves_out_the_embeddings_and_names_its_base(bundled_path: Path) -> None:
    """The six encoder layers and the head ship; the embeddings (tied to the output layer, 11.7 M of the
    model's 22.7 M parameters) are the base's, so the delta stays under the full model's size."""
    from encoder_runtime.model_dir import fingerprint

    size = (dfm.DELTA_DIR / "delta.safetensors").stat().st_size
    assert size < 22 * 2**20, f"shipped delta is {size / 2**20:.1f} MiB"
    assert not any(".embeddings." in name for name in load_file(str(dfm.DELTA_DIR / "delta.safetensors")))
    manifest = json.loads((dfm.DELTA_DIR / "manifest.json").read_text())
    assert manifest["base_fingerprint"] == fingerprint(bundled_path)


def test_assembly_keeps_base_lower_layers_and_applies_delta(assembled: Path, bundled_path: Path) -> None:
    full = load_file(str(assembled / "model.safetensors"))
    base = load_file(str(bundled_path / "model.safetensors"))
    delta = load_file(str(dfm.DELTA_DIR / "delta.safetensors"))
    for key in ("word_embeddings.weight", "position_embeddings.weight", "LayerNorm.weight"):
        assert np.array_equal(full[f"bert.embeddings.{key}"], base[f"embeddings.{key}"])
    for name, value in delta.items():
        assert np.array_equal(full[name], value.astype(np.float32)), name
    assert any(name.startswith("cls.predictions.transform") for name in delta)


def test_assembled_folder_is_reused(assembled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOZE_CACHE_DIR", str(assembled.parents[1]))
    before = (assembled / "model.safetensors").stat().st_mtime_ns
    assert dfm.default_fill_mask_path() == assembled
    assert (assembled / "model.safetensors").stat().st_mtime_ns == before


def test_default_model_knows_paris_is_in_france(assembled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real quality assertion on the shipped weights, through the service's runtime."""
    from encoder_runtime import load_fill_mask

    monkeypatch.setenv("CLOZE_CACHE_DIR", str(assembled.parents[1]))
    runtime = load_fill_mask(backend="torch")
    assert runtime.info.path == assembled
    [result] = runtime.fill_mask(["Paris is the capital of [MASK]."], top_k=3)
    top3 = [p["token_str"] for p in result.masks[0]]
    assert "france" in top3, top3
