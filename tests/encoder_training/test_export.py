"""Export: an ST folder + ONNX in the runtime's cache layout + card, loaded by the runtime as it is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from encoder_runtime import load_encoder
from encoder_training import export

SENTENCES = ["a cat sat on the mat", "the king of france", "a long sentence with many words in it", "dog"]


@pytest.fixture(scope="module")
def finetuned(tiny_bert: Path, shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from encoder_training.finetuning.train import FinetuneConfig, finetune

    out = tmp_path_factory.mktemp("export-src") / "ft"
    config = FinetuneConfig(
        model=str(tiny_bert),
        out=str(out),
        pairs=["coco"],
        limit=64,
        batch_size=8,
        max_steps=2,
        data_dir=str(shared_data),
    )
    return finetune(config)


@pytest.fixture(scope="module")
def exported(finetuned: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "my-encoder"
    return export.export_model(finetuned, out, measure_scores=False)


def test_export_writes_the_runtime_onnx_cache_layout_and_a_card(exported: Path, finetuned: Path) -> None:
    for name in (
        "modules.json",
        "model.safetensors",
        "onnx/embed.onnx",
        "onnx/embed_int8.onnx",
        "onnx/embed.json",
    ):
        assert (exported / name).is_file(), name
    card = json.loads((exported / "card.json").read_text())
    assert card["model_id"] == "my-encoder" and card["dimension"] == 32
    assert card["training"]["steps"] == 2 and card["training"]["data"] == {"coco": 64}
    assert "not measured" in card["scores"]["all"]
    readme = (exported / "README.md").read_text()
    assert "# my-encoder" in readme and "steps 2" in readme
    from encoder_runtime.model_dir import fingerprint

    assert json.loads((exported / "onnx" / "embed.json").read_text())["fingerprint"] == fingerprint(exported)


def test_runtime_loads_the_export_as_is_and_onnx_matches_torch(exported: Path) -> None:
    stamp = (exported / "onnx" / "embed.onnx").stat().st_mtime_ns
    torch_rt = load_encoder(str(exported), backend="torch")
    onnx_rt = load_encoder(str(exported), backend="onnx")
    int8_rt = load_encoder(str(exported), backend="onnx-int8")
    assert onnx_rt.info.model_id == "my-encoder"
    assert (exported / "onnx" / "embed.onnx").stat().st_mtime_ns == stamp, "runtime re-exported the ONNX file"
    reference = torch_rt.embed(SENTENCES)
    np.testing.assert_allclose(onnx_rt.embed(SENTENCES), reference, atol=1e-4)
    cosine = np.sum(int8_rt.embed(SENTENCES, normalize=True) * reference, axis=1)
    assert cosine.min() > 0.95


def test_export_of_a_plain_encoder_adds_pooling(tiny_bert: Path, tmp_path: Path) -> None:
    out = export.export_model(tiny_bert, tmp_path / "plain", measure_scores=False)
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Normalize"]
    assert "not fine-tuned" in json.loads((out / "card.json").read_text())["training"]


def test_scores_without_their_data_are_recorded_as_not_measured(exported: Path, tmp_path: Path) -> None:
    scores = export.measure(exported, exported, data_dir=tmp_path)  # an empty data folder
    assert scores["onnx_int8_cosine_to_fp32"] > 0.95
    for name in ("stsb_test_spearman", "scifact_ndcg@10", "masked_token_accuracy"):
        assert str(scores[name]).startswith("not measured"), (name, scores[name])
