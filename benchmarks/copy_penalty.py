"""Would a penalty on the sentence's own tokens fix the fill-mask model's copying? (issue 47, one question)

The shipped fill-mask model's top guess is a word of the sentence a third of the time ("He unlocked the door
with his [MASK]." -> door). This scores the shipped model with each mask logit of a token already in the
sentence lowered by ``penalty`` (inf: such tokens are never guessed) on the plausibility suite and LAMA
(the first ``--limit`` facts of each relation), both as ``benchmarks/fill_mask_quality.py`` scores them.

    python benchmarks/copy_penalty.py [--penalties 0 0.5 1 3 inf] [--limit 100]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))

import encoder_training.evaluation.lama as lama  # noqa: E402
from encoder_training.evaluation.plausibility import evaluate_plausibility  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402

SUITE = ROOT / "benchmarks" / "data" / "fill_mask_plausibility.json"
plain_mask_logits = lama.mask_logits


def penalised(penalty: float, special_ids: list[int]):
    """``lama.mask_logits`` with the logits of the tokens in each row's input (special tokens aside) lowered."""

    def mask_logits(model, enc, positions: torch.Tensor) -> torch.Tensor:
        logits = plain_mask_logits(model, enc, positions)
        present = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, enc["input_ids"], True)
        present[:, special_ids] = False
        if penalty == float("inf"):
            return logits.masked_fill(present, float("-inf"))
        return logits - penalty * present.float()

    return mask_logits


def score(model: Path, tokenizer, penalty: float, limit: int) -> dict:
    lama.mask_logits = penalised(penalty, tokenizer.all_special_ids)
    suite = evaluate_plausibility(model, SUITE)
    facts = lama.evaluate_lama(model, DATA / "lama", limit=limit)
    return {
        "penalty": penalty if penalty != float("inf") else "inf",
        "top1_accepted": round(suite["top1_accepted"], 4),
        "top5_accepted": round(suite["top5_accepted"], 4),
        "top1_copied": round(suite["top1_copied"], 4),
        "trex_p@1": round(facts["p@1"], 4),
        "trex_facts": facts["facts"],
        "google_re_p@1": round(facts["google_re"]["p@1"], 4),
    }


def main() -> None:
    from transformers import AutoTokenizer

    from encoder_runtime.default_fill_mask import default_fill_mask_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--penalties", nargs="+", type=float, default=[0, 0.5, 1, 3, float("inf")])
    parser.add_argument("--limit", type=int, default=100, help="LAMA facts per relation (0: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "copy_penalty.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = default_fill_mask_path()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rows = []
    for penalty in args.penalties:
        rows.append(score(model, tokenizer, penalty, args.limit))
        print(json.dumps(rows[-1]), flush=True)
    result = {"command": command(), "model": "the shipped fill-mask model", "lama_limit": args.limit,
              "load_average": load_average(), "rows": rows}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
