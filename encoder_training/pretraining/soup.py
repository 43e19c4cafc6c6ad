"""Average the weights of models fine-tuned from one starting point (a uniform "model soup").

Interpolating a model with its own further-trained descendant keeps much of what each knows (WiSE-FT,
Wortsman et al. 2022): here the content-word fill-mask model and its salient-word continuation, each
better on different LAMA relations, average into one model better than either (README of
``encoder_runtime/models/fill-mask-delta``). The first folder's config and tokenizer are kept.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

WEIGHTS = "model.safetensors"


def average_models(models: list[Path], out: Path) -> Path:
    """Write to ``out`` a copy of ``models[0]`` whose floating-point weights are the mean over ``models``."""
    from safetensors.torch import load_file, save_file

    if len(models) < 2:
        raise ValueError("averaging needs at least two models")
    states = [load_file(str(model / WEIGHTS)) for model in models]
    keys = set(states[0])
    for model, state in zip(models[1:], states[1:], strict=True):
        if set(state) != keys or any(state[k].shape != states[0][k].shape for k in keys):
            raise ValueError(f"{model} does not have the tensors of {models[0]}: not the same architecture")
    averaged = {
        k: sum(state[k] for state in states) / len(states)
        if states[0][k].is_floating_point()
        else states[0][k]
        for k in states[0]
    }
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(
        models[0], out, ignore=shutil.ignore_patterns("checkpoints", WEIGHTS, "*.png", "metrics.json")
    )
    save_file(averaged, str(out / WEIGHTS), metadata={"format": "pt"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", type=Path, nargs="+", required=True, help="model folders, same architecture"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(average_models(args.models, args.out))


if __name__ == "__main__":
    main()
