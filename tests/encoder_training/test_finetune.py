"""Fine-tuning: the data readers on the real shared files, and `cloze train finetune` on a tiny BERT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main
from encoder_training.finetuning import data


def test_snli_pairs_are_entailments(shared_data: Path) -> None:
    rows = data.snli_pairs(shared_data, limit=50)
    assert len(rows) == 50
    assert all(set(row) == {"anchor", "positive"} and row["anchor"] != row["positive"] for row in rows)


def test_snli_triplets_carry_a_contradiction_as_hard_negative(shared_data: Path) -> None:
    rows = data.snli_triplets(shared_data)
    assert 3000 < len(rows) < 6700  # at most one triplet per entailment of 20k labelled pairs
    assert all(len({row["anchor"], row["positive"], row["negative"]}) == 3 for row in rows[:200])


def test_snli_labelled_uses_three_classes(shared_data: Path) -> None:
    labels = {row["label"] for row in data.snli_labelled(shared_data, limit=300)}
    assert labels == {0, 1, 2}


def test_coco_pairs_are_captions_of_one_image(shared_data: Path) -> None:
    rows = data.coco_pairs(shared_data)
    # 5,000 images with 25,014 captions: one pair per consecutive caption of an image
    assert len(rows) == 25_014 - 5_000
    assert all(row["anchor"] and row["positive"] and row["anchor"] != row["positive"] for row in rows[:100])


def test_msrp_keeps_only_positive_train_pairs(shared_data: Path) -> None:
    lines = (
        (shared_data / "msr-paraphrase" / "msr-para-train.tsv").read_text(encoding="utf-8-sig").splitlines()
    )
    positives = sum(1 for line in lines[1:] if line.startswith("1\t"))
    assert len(data.msrp_pairs(shared_data)) == positives > 2000


def test_stsb_scores_are_scaled_to_unit_range(shared_data: Path) -> None:
    rows = data.stsb_rows(shared_data, "train")
    assert len(rows) == 5749
    assert min(row["score"] for row in rows) == 0.0 and max(row["score"] for row in rows) == 1.0


def test_pairs_files_in_jsonl_and_tsv(tmp_path: Path) -> None:
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"q": "a cat", "d": "a kitten", "x": 1}\n{"q": "a dog", "d": "a puppy", "x": 2}\n')
    assert data.file_rows(jsonl, ["q", "d"]) == [
        {"q": "a cat", "d": "a kitten"},
        {"q": "a dog", "d": "a puppy"},
    ]
    tsv = tmp_path / "scored.tsv"
    tsv.write_text('sentence1\tsentence2\tscore\nsay "hi"\thello\t0.5\n')
    assert data.file_rows(tsv) == [{"sentence1": 'say "hi"', "sentence2": "hello", "score": 0.5}]
    with pytest.raises(ValueError, match="lacks column"):
        data.file_rows(jsonl, ["q", "missing"])
    with pytest.raises(FileNotFoundError):
        data.load_training_rows("no-such-set", tmp_path)


def _encoder_weights(folder: Path) -> dict[str, torch.Tensor]:
    weights = load_file(str(folder / "model.safetensors"))
    return {k.removeprefix("bert."): v for k, v in weights.items() if "encoder.layer.0.attention" in k}


def test_finetune_cli_trains_and_saves_a_sentence_transformer(
    tiny_bert: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "ft"
    main(
        [
            "train",
            "finetune",
            "--model",
            str(tiny_bert),
            "--out",
            str(out),
            "--max-steps",
            "3",
            "--batch-size",
            "8",
            "--limit",
            "64",
            "--eval-pairs",
            "40",
            "--matryoshka-dims",
            "32",
            "16",
            "--data-dir",
            str(shared_data),
        ]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    record = json.loads((out / "training.json").read_text())
    assert summary["steps"] == record["steps"] == 3
    assert record["data"] == {"snli-triplets": 64, "coco": 64, "msrp": 64}
    assert "sts-dev_spearman_cosine" in record["sts_dev"]
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Normalize"]
    before, after = _encoder_weights(tiny_bert), _encoder_weights(out)
    assert before.keys() == after.keys() and before
    assert any(not torch.equal(before[k], after[k]) for k in before), "training changed no weight"


def test_finetune_cosine_loss_with_cls_pooling_is_read_by_the_runtime(
    tiny_bert: Path, shared_data: Path, tmp_path: Path
) -> None:
    from encoder_runtime import load_encoder

    out = tmp_path / "cls"
    main(
        [
            "train",
            "finetune",
            "--model",
            str(tiny_bert),
            "--out",
            str(out),
            "--loss",
            "cosine",
            "--pooling",
            "cls",
            "--max-steps",
            "2",
            "--batch-size",
            "8",
            "--limit",
            "32",
            "--data-dir",
            str(shared_data),
        ]
    )
    runtime = load_encoder(str(out), backend="torch")
    assert runtime.info.pooling == "cls" and runtime.info.normalize
    vectors = runtime.embed(["a cat sat on the mat", "the dog plays"])
    assert vectors.shape == (2, 32)
    assert torch.allclose(torch.from_numpy(vectors).norm(dim=1), torch.ones(2), atol=1e-5)
