"""Export a model folder to ONNX (fp32 and per-channel int8), cached beside the model under a fingerprint.

Layout of a cache folder (``<model>/onnx/`` by default; this project's exported models ship it):
``embed.onnx``, ``embed_int8.onnx``, ``fill-mask.onnx``, ``fill-mask_int8.onnx`` and, per task, a
``<task>.json`` naming the fingerprint of the model it was made from, so a changed model is re-exported.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from app.runtime.backends.base import Task
from app.runtime.model_dir import fingerprint

log = logging.getLogger(__name__)
OPSET = 18


def default_cache_dir(model_path: Path, explicit: Path | None = None) -> Path:
    """``explicit`` if given; else ``<model>/onnx`` when writable; else a per-user cache keyed by fingerprint."""
    if explicit:
        return Path(explicit)
    beside = model_path / "onnx"
    if beside.is_dir() or os.access(model_path, os.W_OK):
        return beside
    return Path.home() / ".cache" / "cloze-search" / "onnx" / fingerprint(model_path)


def onnx_file(cache_dir: Path, task: Task, int8: bool) -> Path:
    return cache_dir / f"{task}{'_int8' if int8 else ''}.onnx"


def ensure_onnx(
    model_path: Path, task: Task, int8: bool, input_names: tuple[str, ...], cache_dir: Path
) -> Path:
    """Return the cached ONNX file for ``task``, exporting (and quantising) first when missing or stale."""
    current = fingerprint(model_path)
    stamp_path = cache_dir / f"{task}.json"
    stamp = json.loads(stamp_path.read_text()) if stamp_path.is_file() else {}
    fp32, quantised = onnx_file(cache_dir, task, False), onnx_file(cache_dir, task, True)
    if stamp.get("fingerprint") != current or list(stamp.get("input_names", [])) != list(input_names):
        cache_dir.mkdir(parents=True, exist_ok=True)
        for stale in (fp32, quantised):
            stale.unlink(missing_ok=True)
        export_fp32(model_path, task, input_names, fp32)
        _write_atomic(
            stamp_path, json.dumps({"fingerprint": current, "task": task, "input_names": input_names})
        )
    if int8 and not quantised.is_file():
        quantize_int8(fp32, quantised)
    return quantised if int8 else fp32


def export_fp32(model_path: Path, task: Task, input_names: tuple[str, ...], out: Path) -> None:
    """Trace the same wrapper the torch backend runs, with dynamic batch and sequence axes."""
    import torch

    from app.runtime.backends.modules import load_module

    log.info("exporting %s (%s) to ONNX: %s", model_path, task, out)
    module = load_module(model_path, task, input_names)
    example = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    args = tuple(
        example
        if name == "input_ids"
        else (example > 0).long()
        if name == "attention_mask"
        else torch.zeros_like(example)
        for name in input_names
    )
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    program = torch.onnx.export(
        module,
        args,
        input_names=list(input_names),
        output_names=["output"],
        dynamic_shapes={name: {0: batch, 1: seq} for name in input_names},
        opset_version=OPSET,
        dynamo=True,
    )
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staged = Path(tmp) / out.name
        program.save(str(staged))
        os.replace(staged, out)


def quantize_int8(fp32: Path, out: Path) -> None:
    """Dynamic int8, per-channel, MatMul only: per-tensor weights lose too much (cosine 0.963 vs 0.993)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    log.info("quantising %s to int8 (per-channel)", fp32)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staged = Path(tmp) / out.name
        quantize_dynamic(
            fp32, staged, per_channel=True, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"]
        )
        os.replace(staged, out)


def _write_atomic(path: Path, text: str) -> None:
    staged = path.with_suffix(path.suffix + ".tmp")
    staged.write_text(text)
    os.replace(staged, path)


def export_all(model: str, task: Task = "embed", cache_dir: Path | None = None) -> list[Path]:
    """`cloze export onnx`: fp32 and int8 ahead of time, so the first request doesn't pay for them."""
    from app.runtime.model_dir import resolve_model_path
    from app.runtime.tokenization import TextTokenizer

    path = resolve_model_path(model)
    input_names = TextTokenizer(path, 8).input_names
    cache = default_cache_dir(path, cache_dir)
    return [ensure_onnx(path, task, int8, input_names, cache) for int8 in (False, True)]
