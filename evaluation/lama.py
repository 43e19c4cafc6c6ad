"""LAMA factual probing (Petroni et al., 2019): precision@1/@10 of a masked language model.

T-REx and Google-RE facts are rendered through their relation templates, SQuAD uses its cloze
sentences. As in the paper, only facts whose object is a single token of the model's vocabulary are
scored, and each set's precision is the mean over its relations; the kept share is the coverage.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import torch

GOOGLE_RE_TEMPLATES = {  # the templates of the LAMA paper
    "place_of_birth": "[X] was born in [Y] .",
    "date_of_birth": "[X] (born [Y]).",
    "place_of_death": "[X] died in [Y] .",
}


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def load_facts(lama_dir: Path) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """``{set: {relation: [(sentence with [MASK], object label)]}}`` for T-REx, Google-RE and SQuAD."""
    templates = {row["relation"]: row["template"] for row in _jsonl(lama_dir / "relations.jsonl")}
    sets: dict[str, dict[str, list[tuple[str, str]]]] = {"trex": {}, "google_re": {}, "squad": {}}
    for path in sorted((lama_dir / "TREx").glob("*.jsonl*")):
        relation = path.name.split(".")[0]
        template = templates[relation]
        sets["trex"][relation] = [_render(template, row) for row in _jsonl(path)]
    for relation, template in GOOGLE_RE_TEMPLATES.items():
        path = lama_dir / "Google_RE" / f"{relation}_test.jsonl.gz"
        if path.is_file():
            sets["google_re"][relation] = [_render(template, row) for row in _jsonl(path)]
    squad = lama_dir / "Squad" / "test.jsonl"
    if squad.is_file():
        sets["squad"]["squad"] = [(row["masked_sentences"][0], row["obj_label"]) for row in _jsonl(squad)]
    return sets


def _render(template: str, row: dict) -> tuple[str, str]:
    return template.replace("[X]", row["sub_label"]).replace("[Y]", "[MASK]"), row["obj_label"]


@torch.no_grad()
def rank_objects(
    model, tokenizer, sentences: list[str], k: int = 10, batch_size: int = 64
) -> list[list[int]]:
    """Top-k token ids at the (first) mask of each sentence, batched by length."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    ranked: list[list[int]] = [[] for _ in sentences]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        texts = [sentences[i].replace("[MASK]", tokenizer.mask_token) for i in chunk]
        enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        first_mask = (enc["input_ids"] == tokenizer.mask_token_id).int().argmax(1)
        top = mask_logits(model, enc, first_mask).topk(k, dim=-1).indices
        for i, row in zip(chunk, top.tolist(), strict=True):
            ranked[i] = row
    return ranked


def mask_logits(model, enc, positions: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits at one position per row; BERT's head runs only there (half the cost)."""
    rows = torch.arange(len(positions))
    head = getattr(model, "cls", None)
    if head is None:
        return model(**enc).logits[rows, positions]
    hidden = model.base_model(**enc)[0]
    return head(hidden[rows, positions])


def score_relation(model, tokenizer, facts: list[tuple[str, str]], limit: int = 0) -> dict:
    kept = []
    for sentence, obj in facts:
        pieces = tokenizer(obj, add_special_tokens=False)["input_ids"]
        if len(pieces) == 1 and pieces[0] != tokenizer.unk_token_id and "[MASK]" in sentence:
            kept.append((sentence, pieces[0]))
    kept = kept[:limit] if limit else kept
    if not kept:
        return {"facts": 0, "total": len(facts), "p@1": 0.0, "p@10": 0.0}
    ranked = rank_objects(model, tokenizer, [s for s, _ in kept])
    hits1 = sum(row[0] == obj for row, (_, obj) in zip(ranked, kept, strict=True))
    hits10 = sum(obj in row for row, (_, obj) in zip(ranked, kept, strict=True))
    return {"facts": len(kept), "total": len(facts), "p@1": hits1 / len(kept), "p@10": hits10 / len(kept)}


def summarise(relations: dict[str, dict]) -> dict:
    scored = {name: r for name, r in relations.items() if r["facts"]}
    facts = sum(r["facts"] for r in relations.values())
    total = sum(r["total"] for r in relations.values())

    def mean(key: str) -> float:
        return sum(r[key] for r in scored.values()) / len(scored) if scored else 0.0

    return {
        "p@1": mean("p@1"),
        "p@10": mean("p@10"),
        "facts": facts,
        "coverage": facts / total if total else 0.0,
        "relations": relations,
    }


def evaluate_lama(model_dir: Path, lama_dir: Path, limit: int = 0) -> dict:
    """Per-set results; the top-level ``p@1``/``p@10``/``facts``/``coverage`` are T-REx's."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    results = {}
    for name, relations in load_facts(lama_dir).items():
        results[name] = summarise(
            {rel: score_relation(model, tokenizer, facts, limit) for rel, facts in relations.items()}
        )
    trex = results["trex"]
    return {
        "p@1": trex["p@1"],
        "p@10": trex["p@10"],
        "facts": trex["facts"],
        "coverage": trex["coverage"],
        "google_re": {k: results["google_re"][k] for k in ("p@1", "p@10", "facts", "coverage")},
        "squad": {k: results["squad"][k] for k in ("p@1", "p@10", "facts", "coverage")},
        "per_relation": {name: r["relations"] for name, r in results.items()},
        "model": str(model_dir),
    }
