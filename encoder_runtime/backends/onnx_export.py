"""Export a model folder to ONNX (fp32 and per-channel int8), cached beside the model under a fingerprint.

Layout of a cache folder (``<model>/onnx/`` by default; this project's exported models ship it):
``embed.onnx``, ``embed_int8.onnx``, ``fill-mask.onnx``, ``fill-mask_int8.onnx``, ``rerank.onnx``,
``rerank_int8.onnx`` (a cross-encoder's) and, per task, a ``<task>.json`` naming the fingerprint of the model
it was made from, so a changed model is re-exported.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import types
import warnings
from pathlib import Path

from encoder_runtime.backends.base import Task
from encoder_runtime.backends.static_int8 import calibration_pairs, calibration_texts, fix_activation_scales
from encoder_runtime.model_dir import ModelInfo, fingerprint, resolve_model_path
from encoder_runtime.tokenization import PairTokenizer, TextTokenizer

log = logging.getLogger(__name__)
OPSET = 18
# Part of the cache stamp: a cache made by an older export recipe is exported again.
EXPORTER = 4


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
    wanted = {"fingerprint": current, "task": task, "input_names": list(input_names), "exporter": EXPORTER}
    if any(stamp.get(key) != value for key, value in wanted.items()):
        cache_dir.mkdir(parents=True, exist_ok=True)
        for stale in (fp32, quantised):
            stale.unlink(missing_ok=True)
        stamp = {**wanted, "recipe": export_fp32(model_path, task, input_names, fp32)}
        _write_atomic(stamp_path, json.dumps(stamp))
    if int8 and not quantised.is_file():
        quantize_int8(fp32, quantised, stamp.get("recipe", "unfused"), *calibration_for(model_path, task))
    return quantised if int8 else fp32


def calibration_for(model_path: Path, task: Task) -> tuple[TextTokenizer, list]:
    """The tokenizer and inputs int8's activation scales are calibrated on: the shipped prose, as single
    texts, or for a cross-encoder as (query, passage) pairs, so the segment embeddings and the window a pair
    fills are calibrated as they are served."""
    max_tokens = ModelInfo.read(model_path).max_tokens
    if task == "rerank":
        return PairTokenizer(model_path, max_tokens), calibration_pairs()
    return TextTokenizer(model_path, max_tokens), calibration_texts()


def export_fp32(model_path: Path, task: Task, input_names: tuple[str, ...], out: Path) -> str:
    """Export ``task``'s wrapper with dynamic batch and sequence axes; returns the recipe that made it.

    BERT-family encoders get ONNX Runtime's operator fusion (Attention, BiasGelu, the embedding layer norm:
    faster int8 passes than the unfused graph, see docs/design-decisions.md); anything the fusion
    doesn't recognise, or whose fused graph disagrees with torch, is exported unfused with torch.export.
    """
    log.info("exporting %s (%s) to ONNX: %s", model_path, task, out)
    try:
        _export_fused(model_path, task, input_names, out)
        return "fused"
    except FusionUnavailable as exc:
        log.info("no fused export for %s (%s): exporting it unfused", model_path, exc)
    _export_unfused(model_path, task, input_names, out)
    return "unfused"


class FusionUnavailable(Exception):
    """ONNX Runtime's transformer optimiser can't fuse this model (or its result is wrong)."""


def _example_inputs(input_names: tuple[str, ...], vocab_size: int) -> tuple:
    """Two rows, one padded: the trace sees a real attention mask."""
    import torch

    example = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]]) % vocab_size
    return tuple(
        example
        if name == "input_ids"
        else (example > 0).long()
        if name == "attention_mask"
        else torch.zeros_like(example)
        for name in input_names
    )


def _export_unfused(model_path: Path, task: Task, input_names: tuple[str, ...], out: Path) -> None:
    import torch

    from encoder_runtime.backends.modules import load_module  # torch: an ONNX-only service never loads it

    module = load_module(model_path, task, input_names)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    program = torch.onnx.export(
        module,
        _example_inputs(input_names, module.model.config.vocab_size),
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


def _export_fused(model_path: Path, task: Task, input_names: tuple[str, ...], out: Path) -> None:
    """TorchScript trace in the classic BERT graph shape, then ``onnxruntime.transformers`` fusion.

    Transformers 5 builds its attention mask and scales scores in shapes the fuser doesn't match, so the
    traced copy gets the classic ones: an additive mask from (1 - mask) * min, and scores divided by
    sqrt(head size). Same function, other ops; ``_check_fused`` compares it with torch before it is used.
    """
    import torch
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AttentionInterface

    from encoder_runtime.backends.modules import load_module  # torch, as above

    AttentionInterface.register(_FUSABLE_ATTENTION, _classic_attention)
    try:
        module = load_module(model_path, task, input_names, attn_implementation=_FUSABLE_ATTENTION)
    except (ValueError, TypeError) as exc:  # a model type without pluggable attention
        raise FusionUnavailable(str(exc)) from exc
    base = module.model.base_model
    config = base.config
    if config.model_type not in FUSABLE_MODEL_TYPES or not hasattr(base, "_create_attention_masks"):
        raise FusionUnavailable(f"model type {config.model_type!r}")
    base._create_attention_masks = types.MethodType(_additive_masks, base)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        traced, staged = Path(tmp) / "traced.onnx", Path(tmp) / out.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                module,
                _example_inputs(input_names, module.model.config.vocab_size),
                str(traced),
                input_names=list(input_names),
                output_names=["output"],
                dynamic_axes={
                    **{name: {0: "batch", 1: "sequence"} for name in input_names},
                    "output": {0: "batch"} if task == "rerank" else {0: "batch", 1: "sequence"},
                },
                opset_version=LEGACY_OPSET,
                dynamo=False,
            )
        optimized = optimize_model(
            str(traced),
            model_type="bert",
            num_heads=config.num_attention_heads,
            hidden_size=config.hidden_size,
            optimization_options=_fusion_options(),
        )
        fused = optimized.get_fused_operator_statistics()
        if fused.get("Attention", 0) != config.num_hidden_layers:
            raise FusionUnavailable(
                f"{fused.get('Attention', 0)} of {config.num_hidden_layers} attentions fused"
            )
        optimized.save_model_to_file(str(staged))
        _check_fused(model_path, task, input_names, staged)
        os.replace(staged, out)


def _fusion_options():
    """Every BERT fusion but SkipLayerNormalization, whose CPU kernel is slower than what it fuses (see
    ``SLOW_CPU_FUSIONS``); a CUDA session fuses it itself when it loads the graph."""
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = False
    return options


FUSABLE_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "electra"}
_FUSABLE_ATTENTION = "cloze_onnx_export"
LEGACY_OPSET = 17


def _classic_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    import torch

    scaling = scaling or query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) / (1.0 / scaling)
    probabilities = torch.softmax(scores + attention_mask, dim=-1)
    return torch.matmul(probabilities, value).transpose(1, 2).contiguous(), None


def _additive_masks(self, attention_mask, encoder_attention_mask, embedding_output, **_):
    import torch

    keep = attention_mask.unsqueeze(1).unsqueeze(2).to(embedding_output.dtype)
    return (1.0 - keep) * torch.finfo(embedding_output.dtype).min, None


def _check_fused(model_path: Path, task: Task, input_names: tuple[str, ...], onnx_path: Path) -> None:
    """The fused graph must match the plain torch model on every real (unpadded) position."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from encoder_runtime.backends.modules import load_module  # torch, as above

    module = load_module(model_path, task, input_names)
    inputs = _example_inputs(input_names, module.model.config.vocab_size)
    with torch.inference_mode():
        expected = module(*inputs).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: t.numpy() for n, t in zip(input_names, inputs, strict=True)})[0]
    real = inputs[input_names.index("attention_mask")].numpy().astype(bool)
    if expected.ndim == 2:  # one output per sequence (a cross-encoder's logit): every row is real
        real = np.ones(expected.shape[0], dtype=bool)
    error = float(np.abs(got[real] - expected[real]).max())
    if error > 1e-3 * max(1.0, float(np.abs(expected[real]).max())):
        raise FusionUnavailable(f"fused graph differs from torch by {error:.2e}")


def quantize_int8(
    fp32: Path, out: Path, recipe: str, tokenizer: TextTokenizer, calibration: list | None = None
) -> None:
    """Int8 with per-channel weights and activation scales fixed by calibration (``static_int8``) on
    ``calibration`` (default: the shipped prose), so that a text's vector does not depend on the batch it
    shares."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        dynamic, staged = Path(tmp) / "dynamic.onnx", Path(tmp) / out.name
        quantize_dynamic_int8(fp32, dynamic, recipe)
        fix_activation_scales(dynamic, staged, tokenizer, calibration)
        os.replace(staged, out)


def quantize_dynamic_int8(fp32: Path, out: Path, recipe: str) -> None:
    """Dynamic int8 with per-channel weights: per-tensor weights lose too much agreement with fp32
    (docs/design-decisions.md).

    A fused graph quantises its Attention and embedding ops too (QAttention, faster than int8 MatMuls
    around fp32 attention); an unfused one only its MatMuls."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    log.info("quantising %s to int8 (per-channel)", fp32)
    quiet = _QuantizerInfo()
    logging.getLogger().addFilter(quiet)
    try:
        quantize_dynamic(
            fp32,
            out,
            per_channel=True,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=None if recipe == "fused" else ["MatMul"],
            # Fused ops come from the com.microsoft domain, which ONNX shape inference can't type.
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
    finally:
        logging.getLogger().removeFilter(quiet)


class _QuantizerInfo(logging.Filter):
    """Drops what ``onnxruntime.quantization`` logs below WARNING straight on the root logger: a line per
    tensor it leaves alone (36 for the bundled model), in every export's and every first start's log. Other
    loggers' records never pass a root-logger filter, so nothing else is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or _QUANTIZATION not in record.pathname


_QUANTIZATION = os.path.join("onnxruntime", "quantization")


def _write_atomic(path: Path, text: str) -> None:
    staged = path.with_suffix(path.suffix + ".tmp")
    staged.write_text(text)
    os.replace(staged, path)


def export_all(model: str, task: Task = "embed", cache_dir: Path | None = None) -> list[Path]:
    """`cloze export onnx`: fp32 and int8 ahead of time, so the first request doesn't pay for them."""
    path = resolve_model_path(model)
    input_names = TextTokenizer(
        path, 8
    ).input_names  # a pair has the same inputs (its segment ids among them)
    cache = default_cache_dir(path, cache_dir)
    return [ensure_onnx(path, task, int8, input_names, cache) for int8 in (False, True)]
