"""The fill-mask corpus builder's parsing and the plausibility suite's scoring (issue 47)."""

from __future__ import annotations

import json
from pathlib import Path

from encoder_training.pretraining.corpus import fortunes, wordnet_entry
from evaluation.plausibility import load_suite, score_guesses

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "fill_mask_plausibility.json"

DOG = (
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 001 @ 02083346 n 0000 | a member of the genus "
    'Canis; "the dog barked all night"  '
)


def test_wordnet_synset_becomes_words_gloss_and_example_sentences() -> None:
    assert wordnet_entry(DOG) == (
        "dog, domestic dog, Canis familiaris: a member of the genus Canis. The dog barked all night."
    )
    assert wordnet_entry("  1 This software and database is being provided to you") is None


def test_fortunes_are_split_on_percent_lines(tmp_path: Path) -> None:
    (tmp_path / "wisdom").write_text(
        "A penny saved is a penny earned.\n%\nShort\n%\nLook before\nyou leap.\n"
    )
    assert list(fortunes(tmp_path)) == ["A penny saved is a penny earned.", "Look before you leap."]


def test_suite_scores_accepted_and_copied_guesses() -> None:
    suite = [
        {"text": "He unlocked the door with his [MASK].", "accept": ["key", "keys"]},
        {"text": "The [MASK] barked all morning.", "accept": ["dog"]},
    ]
    result = score_guesses(suite, [["door", "key", "a", "b", "c"], ["dog", "x", "y", "z", "w"]])
    assert (result["top1_accepted"], result["top5_accepted"], result["top1_copied"]) == (0.5, 1.0, 0.5)


def test_shipped_suite_has_one_mask_and_answers_per_sentence() -> None:
    suite = load_suite(SUITE)
    assert len(suite) >= 40
    assert all(item["text"].count("[MASK]") == 1 and item["accept"] for item in suite)
    assert json.loads(SUITE.read_text())["description"]


def test_dropout_field_sets_every_dropout_of_the_model() -> None:
    import torch

    from encoder_training.pretraining.recipes import PretrainConfig
    from encoder_training.pretraining.train import build_model

    cfg = PretrainConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, dropout=0.0)
    model = build_model(cfg, 100)
    probabilities = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert probabilities and set(probabilities) == {0.0}
    assert model.config.hidden_dropout_prob == model.config.attention_probs_dropout_prob == 0.0
    default = build_model(
        PretrainConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), 100
    )
    assert {m.p for m in default.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
