"""Int8 with fixed activation scales: a text's vector no longer depends on what shares its forward pass.

``quantize_dynamic`` quantises each activation tensor with one scale for the whole batch, from that batch's
min and max, so the same text came out different alone than beside others, even beside texts of its own
length (bundled model, real sentences: cosine down to 0.985; docs/design-decisions.md). Here
every ``DynamicQuantizeLinear`` becomes a ``QuantizeLinear`` at the range its input spans over a calibration
text shipped with the package (``calibration/prose.txt``, public-domain English prose), so each token's
activations are quantised on their own. Mean agreement with fp32 stays within 0.002 of the per-batch graph's,
also on text unlike the calibration text (scientific abstracts, web passages, code, other languages: same
result file).

The quantised matmuls of ``quantize_dynamic`` (``MatMulInteger -> Cast -> Mul`` by the two scales, then the
bias ``Add``) become one ``MatMulIntegerToFloat`` each: ONNX Runtime fuses the dynamic pattern itself, not
this one, and a graph of many small nodes costs a fixed time per pass."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from encoder_runtime.tokenization import TextTokenizer

CALIBRATION_TEXT = Path(__file__).with_name("calibration") / "prose.txt"


def fix_activation_scales(
    dynamic: Path, out: Path, tokenizer: TextTokenizer, calibration: list | None = None
) -> None:
    """``dynamic`` (a ``quantize_dynamic`` graph) with activation scales calibrated on ``calibration``
    (what ``tokenizer.encode`` takes; default the shipped prose), written to ``out``."""
    import onnx

    model = onnx.load(str(dynamic))
    ranges = activation_ranges(model, tokenizer, calibration or calibration_texts())
    scales = replace_dynamic_quantizers(model, ranges)
    fuse_integer_matmuls(model, scales)
    onnx.save(model, str(out))


def calibration_texts() -> list[str]:
    return [line for line in CALIBRATION_TEXT.read_text(encoding="utf-8").splitlines() if line.strip()]


def calibration_pairs(query_words: int = 10, count: int = 200) -> list[tuple[str, str]]:
    """(query, passage) pairs from the same prose, for a cross-encoder: a passage's opening words as the
    query, against that passage (a match) and against the next one (a miss), in turn. ``count`` pairs: a
    pair fills up to twice a sentence encoder's window, so half the texts take about the probe time of all."""
    texts = calibration_texts()
    return [
        (" ".join(text.split()[:query_words]), text if i % 2 == 0 else texts[(i + 1) % len(texts)])
        for i, text in enumerate(texts[:count])
    ]


def activation_ranges(model, tokenizer: TextTokenizer, texts: list) -> dict[str, tuple[float, float]]:
    """The min and max each dynamically quantised tensor takes over ``texts``.

    One text a pass: no padding enters the ranges, the ranges don't depend on how texts were batched (the
    probed graph's own scales are still per pass), and only one text's activations are held at a time."""
    import onnx
    import onnxruntime as ort

    watched = [n.input[0] for n in model.graph.node if n.op_type == "DynamicQuantizeLinear"]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in watched:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor named
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    low: dict[str, float] = defaultdict(lambda: np.inf)
    high: dict[str, float] = defaultdict(lambda: -np.inf)
    for item in tokenizer.encode(texts):
        for name, values in zip(watched, session.run(watched, tokenizer.pad([item])), strict=True):
            low[name] = min(low[name], float(values.min()))
            high[name] = max(high[name], float(values.max()))
    return {name: (low[name], high[name]) for name in watched}


def scale_and_zero_point(low: float, high: float) -> tuple[np.float32, np.uint8]:
    """uint8 over [low, high] widened to hold 0, as DynamicQuantizeLinear computes them per batch."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max((high - low) / 255.0, 1e-8)
    return np.float32(scale), np.uint8(np.clip(round(-low / scale), 0, 255))


def replace_dynamic_quantizers(model, ranges: dict[str, tuple[float, float]]) -> dict[str, str]:
    """Each DynamicQuantizeLinear as a QuantizeLinear at fixed constants of the same names; returns the
    name of each activation's scale by the name of its zero point."""
    from onnx import helper, numpy_helper

    graph = model.graph
    nodes, scales = [], {}
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        quantized, scale_name, zero_point_name = node.output
        scales[zero_point_name] = scale_name
        scale, zero_point = scale_and_zero_point(*ranges[node.input[0]])
        graph.initializer.append(numpy_helper.from_array(np.array(scale), scale_name))
        graph.initializer.append(numpy_helper.from_array(np.array(zero_point), zero_point_name))
        nodes.append(
            helper.make_node(
                "QuantizeLinear", [node.input[0], scale_name, zero_point_name], [quantized], name=node.name
            )
        )
    del graph.node[:]
    graph.node.extend(nodes)
    return scales


def fuse_integer_matmuls(model, activation_scales: dict[str, str]) -> None:
    """``MatMulInteger -> Cast -> Mul(scale_a * scale_w) [-> Add(bias)]`` as one ``MatMulIntegerToFloat``;
    a matmul in any other shape is left as it is."""
    from onnx import helper

    graph = model.graph
    constants = {tensor.name for tensor in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    replaced, dropped = {}, set()
    for node in graph.node:
        fused = _fusion(node, producer, consumers, constants, activation_scales)
        if fused is not None:
            replacement, absorbed = fused
            replaced[id(node)] = replacement
            dropped.update(id(n) for n in absorbed)
    nodes = [replaced.get(id(node), node) for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    if replaced and not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _fusion(node, producer, consumers, constants, activation_scales):
    from onnx import helper

    if node.op_type != "MatMulInteger" or len(node.input) != 4:
        return None
    after = consumers[node.output[0]]
    if len(after) != 1 or after[0].op_type != "Cast":
        return None
    cast = after[0]
    after = consumers[cast.output[0]]
    if len(after) != 1 or after[0].op_type != "Mul":
        return None
    rescale = after[0]
    scales = producer.get(next(name for name in rescale.input if name != cast.output[0]))
    if scales is None or scales.op_type != "Mul" or len(consumers[scales.output[0]]) != 1:
        return None
    absorbed, output, bias = [cast, rescale, scales], rescale.output[0], ""
    after = consumers[output]
    if len(after) == 1 and after[0].op_type == "Add":
        constant = [name for name in after[0].input if name in constants]
        if len(constant) == 1:
            bias, output = constant[0], after[0].output[0]
            absorbed.append(after[0])
    a, b, a_zero_point, b_zero_point = node.input
    a_scale = activation_scales.get(a_zero_point)
    if a_scale not in scales.input:
        return None
    b_scale = next(name for name in scales.input if name != a_scale)
    fused = helper.make_node(
        "MatMulIntegerToFloat",
        [a, b, a_scale, b_scale, a_zero_point, b_zero_point, bias],
        [output],
        name=f"{node.name}_to_float",
        domain="com.microsoft",
    )
    return fused, absorbed
