"""``cloze eval mlm`` and ``cloze eval lama``: the last stdout line is one JSON object with the metrics."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from app.cli import build_parser
from evaluation.lama import load_facts


def run(argv: list[str], capsys: pytest.CaptureFixture) -> dict:
    args = build_parser().parse_args(argv)
    args.handler(args)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_eval_mlm_reports_accuracy_and_pseudo_perplexity(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text = tmp_path / "held.txt"
    text.write_text("\n\n".join(["the cat sat on the mat . the dog sat on the mat with a king"] * 40))
    result = run(["eval", "mlm", "--model", str(tiny_bert), "--data", str(text), "--ppl-lines", "5"], capsys)
    assert 0.0 <= result["accuracy"] <= 1.0 and result["masked_tokens"] > 50
    vocab = json.loads((tiny_bert / "config.json").read_text())["vocab_size"]
    # an untrained model is near-uniform: pseudo-perplexity of the order of the vocabulary size
    assert vocab / 4 < result["pseudo_perplexity"] < vocab * 4
    assert math.isfinite(result["loss"])


def mini_lama(root: Path) -> Path:
    """A LAMA-shaped folder: one T-REx relation, one Google-RE relation, SQuAD."""
    (root / "TREx").mkdir(parents=True)
    (root / "Google_RE").mkdir()
    (root / "Squad").mkdir()
    (root / "relations.jsonl").write_text(
        json.dumps({"relation": "P36", "template": "The capital of [X] is [Y] ."})
    )
    facts = [
        {"sub_label": "france", "obj_label": "Paris"},
        {"sub_label": "england", "obj_label": "Londonderry"},
    ]
    with gzip.open(root / "TREx" / "P36.jsonl.gz", "wt") as handle:
        handle.write("\n".join(json.dumps(f) for f in facts))
    with gzip.open(root / "Google_RE" / "place_of_birth_test.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"sub_label": "the king", "obj_label": "paris"}))
    squad = {"masked_sentences": ["the cat sat on the [MASK] ."], "obj_label": "mat"}
    (root / "Squad" / "test.jsonl").write_text(json.dumps(squad))
    return root


def test_lama_renders_templates(tmp_path: Path) -> None:
    facts = load_facts(mini_lama(tmp_path / "lama"))
    assert facts["trex"]["P36"][0] == ("The capital of france is [MASK] .", "Paris")
    assert facts["google_re"]["place_of_birth"][0] == ("the king was born in [MASK] .", "paris")
    assert facts["squad"]["squad"][0][1] == "mat"


def test_eval_lama_keeps_single_token_objects(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    lama = mini_lama(tmp_path / "lama")
    result = run(["eval", "lama", "--model", str(tiny_bert), "--data", str(lama)], capsys)
    # "Paris" is one token of the tiny vocabulary, "Londonderry" is not: half the T-REx facts are scored
    assert result["facts"] == 1 and result["coverage"] == 0.5
    assert 0.0 <= result["p@1"] <= result["p@10"] <= 1.0
    assert result["google_re"]["facts"] == 1 and result["squad"]["facts"] == 1


def test_eval_lama_on_the_real_probe(
    tiny_bert: Path, shared_data: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["eval", "lama", "--model", str(tiny_bert), "--data", str(shared_data / "lama"), "--limit", "3"]
    result = run(argv, capsys)
    assert len(result["per_relation"]["trex"]) == 28
    assert 0 < result["coverage"] < 0.2  # a 50-word vocabulary covers few objects
