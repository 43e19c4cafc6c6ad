"""Fill-mask plausibility: everyday sentences with one mask and the answers accepted as sensible.

Three figures over a suite (``benchmarks/data/fill_mask_plausibility.json``, answers fixed before any model
was scored): the share whose top guess is accepted, whose top five hold an accepted answer, and whose top
guess is a word copied from the sentence itself (a weak model's habit: "He unlocked the door with his door").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from evaluation.lama import rank_objects


def load_suite(path: Path) -> list[dict]:
    return json.loads(path.read_text())["sentences"]


def sentence_words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.replace("[MASK]", " ").lower()))


def score_guesses(suite: list[dict], guesses: list[list[str]]) -> dict:
    """The three shares and each sentence's top five, from the model's ranked words per sentence."""
    rows = []
    for item, words in zip(suite, guesses, strict=True):
        accepted = set(item["accept"])
        rows.append(
            {
                "text": item["text"],
                "top5": words[:5],
                "top1_accepted": words[0] in accepted,
                "top5_accepted": any(w in accepted for w in words[:5]),
                "top1_copied": words[0] in sentence_words(item["text"]),
            }
        )
    n = len(rows)
    return {
        "sentences": n,
        "top1_accepted": sum(r["top1_accepted"] for r in rows) / n,
        "top5_accepted": sum(r["top5_accepted"] for r in rows) / n,
        "top1_copied": sum(r["top1_copied"] for r in rows) / n,
        "rows": rows,
    }


@torch.no_grad()
def evaluate_plausibility(model_dir: Path, suite_path: Path) -> dict:
    """Score an MLM folder on the suite (the plain top-k over the vocabulary, as ``POST /fill-mask`` ranks)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    suite = load_suite(suite_path)
    ranked = rank_objects(model, tokenizer, [item["text"] for item in suite], k=5)
    guesses = [[tokenizer.convert_ids_to_tokens(i).removeprefix("##") for i in row] for row in ranked]
    return {"model": str(model_dir), **score_guesses(suite, guesses)}
