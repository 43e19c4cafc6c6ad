"""`cloze export` of a cross-encoder folder: the folder, ONNX fp32 and int8 rerank files, and a card."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.cli import main
from encoder_runtime import load_reranker
from encoder_training import export


def test_a_cross_encoder_exports_to_onnx_and_a_card_the_runtime_loads(
    tiny_cross_encoder: Path, tmp_path: Path
):
    out = export.export_model(tiny_cross_encoder, tmp_path / "my-reranker", measure_scores=False)
    for name in (
        "config.json",
        "model.safetensors",
        "onnx/rerank.onnx",
        "onnx/rerank_int8.onnx",
        "onnx/rerank.json",
    ):
        assert (out / name).is_file(), name
    card = json.loads((out / "card.json").read_text())
    assert card["kind"] == "rerank" and card["model_id"] == "my-reranker" and card["max_tokens"] == 64
    assert 0 <= card["scores"]["onnx_int8_max_score_difference"] < 0.05
    assert "# my-reranker" in (out / "README.md").read_text()
    pairs = ("the cat sat", ["the dog sat on the mat", "paris is a city"])
    torch_scores = load_reranker(out, backend="torch").score(*pairs)
    onnx_scores = load_reranker(out, backend="onnx").score(*pairs)  # the exported file, not a new export
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-4)


def test_export_reranker_records_the_scores_its_trainer_measured(tiny_cross_encoder: Path, tmp_path: Path):
    """What `cloze train reranker` calls: its measured scores and recipe go on the card."""
    out = export.export_reranker(
        tiny_cross_encoder,
        tmp_path / "trained",
        scores={"scifact_test_ndcg@10": 0.5},
        training={"steps": 3},
    )
    card = json.loads((out / "card.json").read_text())
    assert card["scores"]["scifact_test_ndcg@10"] == 0.5 and card["training"] == {"steps": 3}


def test_cloze_export_onnx_picks_the_rerank_task_for_a_cross_encoder(tiny_cross_encoder, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_cross_encoder, model, ignore=shutil.ignore_patterns("onnx"))
    main(["export", "onnx", "--model", str(model)])
    printed = capsys.readouterr().out.split()
    assert [Path(p).name for p in printed] == ["rerank.onnx", "rerank_int8.onnx"]
