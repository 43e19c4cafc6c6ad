"""STS evaluation: readers on the real sets, the bundled model's published score, the CLI's JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from evaluation import sts


def test_readers_count_the_published_pairs(shared_data: Path) -> None:
    assert len(sts.read_stsb(shared_data, "test")) == 1379
    assert len(sts.read_stsb(shared_data, "dev")) == 1500
    sick = sts.read_sick(shared_data)
    assert len(sick) == 4927 and 1.0 <= min(sick.scores) and max(sick.scores) <= 5.0
    sts15 = sts.read_semeval(shared_data, 2015)
    assert 0 < len(sts15) < 8500  # unannotated rows (empty score) are dropped
    assert all(0.0 <= s <= 5.0 for s in sts15.scores)
    with pytest.raises(ValueError, match="unknown STS set"):
        sts.read_sets(shared_data, ["nope"])


def test_bundled_model_scores_its_published_stsb_test_spearman(shared_data: Path, bundled_torch) -> None:
    score = sts.spearman_of(bundled_torch.embed, sts.read_stsb(shared_data, "test"))
    assert score == pytest.approx(0.820, abs=0.005)  # all-MiniLM-L6-v2: about 0.82 published


def test_spearman_is_one_for_a_perfect_embedding() -> None:
    """Pairs whose cosine rises with the gold score must correlate perfectly; reversed, -1."""
    import numpy as np

    pairs = sts.StsSet("toy", ["s0", "s1", "s2"], ["t0", "t1", "t2"], [0.0, 2.5, 5.0])
    angles = {"s0": 0.0, "s1": 0.0, "s2": 0.0, "t0": 1.5, "t1": 0.8, "t2": 0.1}

    def embed(texts: list[str]) -> np.ndarray:
        return np.array([[np.cos(angles[t]), np.sin(angles[t])] for t in texts])

    assert sts.spearman_of(embed, pairs) == pytest.approx(1.0)
    reversed_pairs = sts.StsSet("toy", pairs.sentences1, pairs.sentences2, [5.0, 2.5, 0.0])
    assert sts.spearman_of(embed, reversed_pairs) == pytest.approx(-1.0)


def test_eval_sts_cli_prints_one_json_object_last(
    tiny_bert: Path, shared_data: Path, capsys: pytest.CaptureFixture
) -> None:
    main(
        [
            "eval",
            "sts",
            "--model",
            str(tiny_bert),
            "--sets",
            "stsb-test",
            "sick-r",
            "--limit",
            "60",
            "--data-dir",
            str(shared_data),
        ]
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["pairs"] == 60 and -1.0 <= result["spearman"] <= 1.0
    assert set(result["sets"]) == {"stsb-test", "sick-r"}
    assert result["spearman"] == result["sets"]["stsb-test"]["spearman"]
