"""Cut a fill-mask model trained over a frozen base encoder down to what training changed.

With ``train_top_layers`` only the top encoder layers (all of them when it equals the layer count) and the
MLM head transform/bias move; the embeddings (and the tied output layer) and any lower layers are the base
model's. Shipping just those tensors in fp16 keeps the default fill-mask model under the base's size (all six
layers: 20.7 MiB, the embeddings' 22 MiB left out); ``encoder_runtime.default_fill_mask`` re-assembles the full
folder from the base at first use.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from encoder_runtime.model_dir import bundled_model_path, fingerprint

HEAD_KEYS = (
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.bias",
)


def delta_keys(num_layers: int, top_layers: int) -> list[str]:
    """Prefixes and names of the tensors a top-``top_layers`` run trains."""
    layers = [f"bert.encoder.layer.{i}." for i in range(num_layers - top_layers, num_layers)]
    return [*layers, *HEAD_KEYS]


def extract_delta(
    model_dir: Path, base_dir: Path, out: Path, top_layers: int, extra: dict | None = None
) -> Path:
    """Write ``delta.safetensors`` (fp16) and ``manifest.json`` (base fingerprint, layers, metrics)."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((model_dir / "config.json").read_text())
    state = load_file(str(model_dir / "model.safetensors"))
    wanted = delta_keys(config["num_hidden_layers"], top_layers)
    delta = {
        k: v.to(torch.float16).contiguous() for k, v in state.items() if any(k.startswith(w) for w in wanted)
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(delta, str(out / "delta.safetensors"))
    manifest = {
        "base_fingerprint": fingerprint(base_dir),
        "top_layers": top_layers,
        "tensors": len(delta),
        "parameters": sum(v.numel() for v in delta.values()),
        **(extra or {}),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="the trained BertForMaskedLM folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--top-layers", type=int, default=2)
    parser.add_argument("--extra", type=Path, help="a JSON file of facts (recipe, metrics) for the manifest")
    args = parser.parse_args()

    extra = json.loads(args.extra.read_text()) if args.extra else None
    print(extract_delta(args.model, bundled_model_path(), args.out, args.top_layers, extra))


if __name__ == "__main__":
    main()
