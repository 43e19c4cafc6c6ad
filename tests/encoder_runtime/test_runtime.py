"""The inference runtime: batched == one-by-one, backends agree, fill-mask shape, truncation."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from encoder_runtime import NoMaskToken, load_encoder, load_fill_mask
from encoder_runtime.model_dir import ModelInfo
from encoder_runtime.tokenization import plan_batches
from tests.conftest import sts_sentences


@pytest.fixture(scope="module")
def tiny_fill_mask(tiny_bert):
    return load_fill_mask(str(tiny_bert), backend="torch")


def test_model_info_reads_sentence_transformers_config(bundled_path):
    info = ModelInfo.read(bundled_path)
    assert (info.pooling, info.normalize, info.max_tokens) == ("mean", True, 256)
    assert info.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert len(info.fingerprint) == 16


def test_plain_hf_folder_defaults_to_mean_pooling_without_normalisation(tiny_bert):
    info = ModelInfo.read(tiny_bert)
    assert (info.pooling, info.normalize, info.max_tokens) == ("mean", False, 64)


def test_pooling_is_read_from_either_sentence_transformers_config_form(tiny_bert, tmp_path):
    import json
    import shutil

    for config, expected in (({"pooling_mode": "cls"}, "cls"), ({"pooling_mode_max_tokens": True}, "max")):
        model = tmp_path / expected
        shutil.copytree(tiny_bert, model, ignore=shutil.ignore_patterns("onnx"))
        (model / "modules.json").write_text(
            json.dumps([{"idx": 1, "path": "1_Pooling", "type": "x.Pooling"}])
        )
        (model / "1_Pooling").mkdir()
        (model / "1_Pooling" / "config.json").write_text(json.dumps(config))
        assert ModelInfo.read(model).pooling == expected


def test_plan_batches_respects_token_budget_and_sorts_by_length():
    lengths = [5, 100, 7, 50, 6, 99]
    batches = plan_batches(lengths, max_batch_tokens=200, max_batch_size=8)
    assert sorted(i for batch in batches for i in batch) == list(range(6))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 200
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(flat)


@pytest.mark.parametrize("max_padding", [0.0, 0.02, 0.1, 0.5])
def test_plan_batches_keeps_padding_within_its_bound(max_padding: float):
    lengths = [10, 11, 12, 12, 13, 20, 21, 40, 41, 41, 44]
    batches = plan_batches(lengths, max_batch_tokens=10_000, max_batch_size=64, max_padding=max_padding)
    for batch in batches:
        real = sum(lengths[i] for i in batch)
        assert len(batch) * max(lengths[i] for i in batch) <= (1 + max_padding) * real
    assert len(batches) == {0.0: 9, 0.02: 8, 0.1: 4, 0.5: 2}[max_padding]


def test_plan_batches_lets_short_texts_share_a_pass_within_the_padding_tokens():
    """A pass's fixed cost, stated as ``padding_tokens``, lets texts a few tokens apart share a batch that
    the fraction alone would split; the allowance bounds each batch's padding in absolute tokens."""
    lengths = [10, 11, 12, 12, 13, 20, 21, 40, 41, 41, 44]
    alone = plan_batches(lengths, max_batch_tokens=10_000, max_batch_size=64, max_padding=0.0)
    shared = plan_batches(lengths, 10_000, 64, max_padding=0.0, padding_tokens=8)
    for batch in shared:
        longest = max(lengths[i] for i in batch)
        assert len(batch) * longest - sum(lengths[i] for i in batch) <= 8
    assert [[lengths[i] for i in batch] for batch in shared] == [
        [10, 11, 12, 12, 13],  # 7 padded tokens
        [20, 21],  # 20 more would pad by 42
        [40, 41, 41],
        [44],  # with it, 10 padded tokens
    ]
    assert len(alone) == 9


def test_batched_embeddings_equal_one_by_one(bundled_torch, shared_data):
    texts = sts_sentences(shared_data, 40)
    batched = bundled_torch.embed(texts)
    single = np.vstack([bundled_torch.embed([text]) for text in texts])
    assert batched.shape == (40, 384) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, single, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_texts_are_tokenised_a_chunk_ahead_of_the_passes(bundled_torch, shared_data, monkeypatch):
    """Many texts: the next chunk is tokenised (on another thread) while the current chunk's passes run, and
    the vectors are those of one text at a time."""
    import threading

    from encoder_runtime import encoder

    texts = sts_sentences(shared_data, 24)
    monkeypatch.setattr(encoder, "TOKENIZE_AHEAD", 8)
    encode, run = bundled_torch.encode, bundled_torch.run
    second_chunk_started = threading.Event()
    first_pass_saw_it: list[bool] = []
    chunks: list[str] = []

    def tokenise(chunk: list[str]):
        chunks.append(chunk[0])
        if chunk[0] == texts[8]:
            second_chunk_started.set()
        return encode(chunk)

    first_pass = threading.Lock()  # a chunk's passes may run side by side: only the first one waits

    def passes(items):
        with first_pass:
            if (
                not first_pass_saw_it
            ):  # tokenising one chunk, then running it, would leave this waiting in vain
                first_pass_saw_it.append(second_chunk_started.wait(5))
        return run(items)

    monkeypatch.setattr(bundled_torch, "encode", tokenise)
    monkeypatch.setattr(bundled_torch, "run", passes)
    ahead = bundled_torch.embed(texts)
    monkeypatch.undo()
    assert first_pass_saw_it == [True] and chunks == [texts[0], texts[8], texts[16]]
    one_by_one = np.vstack([bundled_torch.embed([text]) for text in texts])
    np.testing.assert_allclose(ahead, one_by_one, atol=2e-5)


def test_bundled_model_matches_sentence_transformers(bundled_torch, bundled_path, shared_data):
    from sentence_transformers import SentenceTransformer

    texts = sts_sentences(shared_data, 16)
    reference = SentenceTransformer(str(bundled_path), device="cpu").encode(texts)
    np.testing.assert_allclose(bundled_torch.embed(texts), reference, atol=1e-4)


@pytest.fixture(scope="module")
def onnx_pair(tmp_path_factory):
    cache = tmp_path_factory.mktemp("onnx-cache")
    return (
        load_encoder(backend="onnx", onnx_cache=cache),
        load_encoder(backend="onnx-int8", onnx_cache=cache),
    )


@pytest.mark.slow  # whole-model exports, Ray, subprocess kills or real data: make test, not test-fast
def test_onnx_fp32_agrees_with_torch(bundled_torch, onnx_pair, shared_data):
    texts = sts_sentences(shared_data, 200)
    cosine = (bundled_torch.embed(texts) * onnx_pair[0].embed(texts)).sum(axis=1)
    assert cosine.min() > 0.9999


@pytest.mark.slow  # whole-model exports, Ray, subprocess kills or real data: make test, not test-fast
def test_onnx_int8_keeps_quality_on_real_text(bundled_torch, onnx_pair, shared_data):
    texts = sts_sentences(shared_data, 400)
    cosine = (bundled_torch.embed(texts) * onnx_pair[1].embed(texts)).sum(axis=1)
    assert cosine.mean() >= 0.99
    assert onnx_pair[1].backend.name == "onnx-int8"
    assert onnx_pair[1].backend.provider == "CPUExecutionProvider"
    # On a CPU: one single-threaded pass per core, side by side, offline as in the micro-batcher.
    assert onnx_pair[1].backend.parallel_passes == (os.cpu_count() or 1)
    assert onnx_pair[1].backend.session.get_session_options().intra_op_num_threads == 1
    assert onnx_pair[1].backend.max_padding < bundled_torch.backend.max_padding  # short batches per core
    assert onnx_pair[1].backend.padding_tokens > 0  # but a pass's fixed cost lets near lengths share one


def test_a_cpu_pass_holds_the_backends_budget_unless_the_caller_sets_one(
    bundled_torch, onnx_pair, shared_data
):
    """On a CPU a pass holds far fewer padded tokens than the 8,192 a GPU gets (offline and in the
    micro-batcher): a longer one runs slower per token and grows ONNX Runtime's arena
    (docs/design-decisions.md). A budget the caller sets wins."""
    from encoder_runtime import EncoderRuntime, MicroBatcher

    int8 = onnx_pair[1]
    assert int8.backend.batch_tokens == 512 and bundled_torch.backend.batch_tokens == 1024
    for runtime in (bundled_torch, int8):
        assert runtime.max_batch_tokens == runtime.backend.batch_tokens
        assert MicroBatcher.for_runtime(runtime, max_batch_tokens=300).max_batch_tokens == 300
    assert (
        EncoderRuntime(int8.info, int8.tokenizer, int8.backend, max_batch_tokens=300).max_batch_tokens == 300
    )

    sentences = sts_sentences(shared_data, 400)
    documents = [" ".join(sentences[i : i + 40]) for i in range(0, 400, 40)]  # each past the 256-token window
    passes: list[int] = []

    async def served() -> None:
        batcher = MicroBatcher.for_runtime(int8, on_batch=lambda rows, tokens: passes.append(tokens))
        await asyncio.gather(*(batcher.submit([document]) for document in documents))
        await batcher.stop()

    asyncio.run(served())
    budget = int8.backend.batch_tokens
    assert len(passes) >= len(documents) * 256 / budget
    assert max(passes) <= budget < 2 * max(passes)  # full passes, none past the budget


def test_int8_vector_of_a_text_does_not_depend_on_its_batch(onnx_pair, shared_data):
    """Activation scales are calibrated, not taken from each batch: a text's int8 vector is the same alone
    as in one padded pass with texts of its own and other lengths (per-batch scales moved it, cosine down to
    0.985: docs/design-decisions.md)."""
    import onnx

    int8 = onnx_pair[1]
    texts = sts_sentences(shared_data, 60)
    items = int8.encode(texts)
    lengths = {len(item) for item in items}
    assert 3 < len(lengths) < len(items)  # neighbours of its own length and of others
    alone = np.vstack([int8.finish(int8.run([item])) for item in items])
    together = int8.finish(int8.run(items))
    np.testing.assert_allclose(together, alone, atol=1e-6)
    ops = {node.op_type for node in onnx.load(int8.backend.onnx_path).graph.node}
    assert "DynamicQuantizeLinear" not in ops and "MatMulIntegerToFloat" in ops


def test_torch_on_a_cpu_runs_one_single_threaded_pass_per_core(bundled_torch):
    """Each pass runs on one OpenMP thread, and only inside the pass: the caller's setting is left as it was."""
    import torch

    backend = bundled_torch.backend
    assert backend.parallel_passes == (os.cpu_count() or 1)
    seen, callers_threads = [], torch.get_num_threads()
    hook = backend.module.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    try:
        bundled_torch.embed(["one pass", "and another text to embed"])
    finally:
        hook.remove()
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == callers_threads  # the caller keeps its own setting


def test_int8_export_logs_no_line_per_tensor(tiny_bert, tmp_path, caplog):
    """onnxruntime.quantization logs each tensor it skips at INFO on the root logger; the export drops those
    and keeps its own line."""
    import logging

    with caplog.at_level(logging.INFO):
        load_encoder(str(tiny_bert), backend="onnx-int8", onnx_cache=tmp_path / "cache")
    quantizer = os.path.join("onnxruntime", "quantization")
    from_quantizer = [r for r in caplog.records if quantizer in r.pathname and r.levelno < logging.WARNING]
    assert not from_quantizer, [r.getMessage() for r in from_quantizer][:3]
    assert any("quantising" in r.getMessage() for r in caplog.records)


def test_onnx_cache_is_reused_and_refreshed_when_the_model_changes(tiny_bert, tmp_path):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model, ignore=shutil.ignore_patterns("onnx"))
    cache = tmp_path / "cache"
    load_encoder(str(model), backend="onnx", onnx_cache=cache)
    stamp = json.loads((cache / "embed.json").read_text())
    exported_at = (cache / "embed.onnx").stat().st_mtime_ns
    load_encoder(str(model), backend="onnx", onnx_cache=cache)
    assert (cache / "embed.onnx").stat().st_mtime_ns == exported_at  # reused
    config = json.loads((model / "config.json").read_text())
    config["layer_norm_eps"] = 1e-6  # a changed model...
    (model / "config.json").write_text(json.dumps(config))
    load_encoder(str(model), backend="onnx", onnx_cache=cache)
    assert (
        json.loads((cache / "embed.json").read_text())["fingerprint"] != stamp["fingerprint"]
    )  # ...re-exported


def test_fill_mask_answers_each_mask_in_pipeline_shape(tiny_fill_mask):
    [result] = tiny_fill_mask.fill_mask(["the cat [MASK] on the [MASK] ."], top_k=3)
    assert len(result.masks) == 2
    for predictions in result.masks:
        assert len(predictions) == 3
        assert set(predictions[0]) == {"score", "token", "token_str", "sequence"}
        scores = [p["score"] for p in predictions]
        assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1
    # several masks: as in the pipeline, special tokens stay in the sequence, so the other mask shows
    first = result.masks[0][0]
    assert first["sequence"].startswith("[CLS] the cat " + first["token_str"] + " on the [MASK]")
    [single] = tiny_fill_mask.fill_mask(["the cat [MASK] on the mat ."], top_k=1)
    assert single.masks[0][0]["sequence"].startswith("the cat " + single.masks[0][0]["token_str"])


def test_pipeline_output_nests_as_transformers_does(tiny_fill_mask):
    from encoder_runtime import pipeline_output

    one, two = tiny_fill_mask.fill_mask(["the cat [MASK] .", "the [MASK] sat on the [MASK] ."], top_k=2)
    assert pipeline_output([one], inputs_is_list=False) == one.masks[0]  # flat list of predictions
    assert pipeline_output([one], inputs_is_list=True) == one.masks[0]  # a list of one: the same
    assert pipeline_output([two], inputs_is_list=False) == two.masks  # a list per mask
    assert pipeline_output([one, two], inputs_is_list=True) == [one.masks[0], two.masks]


def test_fill_mask_batched_equals_one_by_one(tiny_fill_mask):
    texts = ["the [MASK] sat .", "a long sentence of words with a [MASK] in it and more words", "[MASK] ."]
    batched = tiny_fill_mask.fill_mask(texts, top_k=5)
    single = [tiny_fill_mask.fill_mask([text], top_k=5)[0] for text in texts]
    for a, b in zip(batched, single, strict=True):
        assert [[p["token"] for p in m] for m in a.masks] == [[p["token"] for p in m] for m in b.masks]


def test_fill_mask_targets_restrict_candidates(tiny_fill_mask):
    [result] = tiny_fill_mask.fill_mask(["the [MASK] sat ."], top_k=5, targets=["cat", "dog"])
    assert {p["token_str"] for p in result.masks[0]} == {"cat", "dog"}


def test_fill_mask_without_mask_names_the_token(tiny_fill_mask):
    with pytest.raises(NoMaskToken, match=r"\[MASK\]"):
        tiny_fill_mask.fill_mask(["no mask here"])


def test_fill_mask_past_truncation_is_reported(tiny_fill_mask):
    text = "the cat sat " * 40 + "[MASK] ."  # 120+ tokens, the tiny model's window is 64
    [result] = tiny_fill_mask.fill_mask([text])
    assert result.truncated and result.masks_dropped == 1 and result.masks == []


def test_overlong_embedding_input_is_truncated_and_flagged(bundled_torch):
    [item] = bundled_torch.encode(["word " * 1000])
    assert item.truncated and len(item) == bundled_torch.max_tokens


@pytest.mark.parametrize("model_type", ["bert", "distilbert"])
def test_export_fuses_bert_family_and_falls_back_unfused_otherwise(model_type, tiny_bert, tmp_path):
    """BERT gets ORT's fused graph, a type the fuser doesn't know the plain torch.export one: both match torch."""
    import json
    import shutil

    from transformers import DistilBertConfig, DistilBertModel

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model, ignore=shutil.ignore_patterns("onnx", "*.safetensors", "config.json"))
    if model_type == "bert":
        shutil.copy(tiny_bert / "config.json", model)
        shutil.copy(tiny_bert / "model.safetensors", model)
    else:
        config = DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
        DistilBertModel(config).save_pretrained(model)
        tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
        tokenizer_config["model_input_names"] = ["input_ids", "attention_mask"]  # no token types
        (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    texts = ["the cat sat on the mat .", "paris"]
    torch_vectors = load_encoder(str(model), backend="torch").embed(texts)
    onnx_vectors = load_encoder(str(model), backend="onnx", onnx_cache=tmp_path / "cache").embed(texts)
    recipe = json.loads((tmp_path / "cache" / "embed.json").read_text())["recipe"]
    assert recipe == ("fused" if model_type == "bert" else "unfused")
    assert (torch_vectors * onnx_vectors).sum(axis=1).min() > 0.9999
    int8 = load_encoder(str(model), backend="onnx-int8", onnx_cache=tmp_path / "cache")
    alone = np.vstack([int8.embed([text]) for text in texts])
    np.testing.assert_allclose(int8.embed(texts), alone, atol=1e-6)  # either recipe: calibrated scales
    assert (int8.embed(texts) * onnx_vectors).sum(axis=1).min() > 0.95


def test_cpu_sessions_keep_add_and_layer_norm_apart(tiny_bert, tmp_path):
    """ORT's CPU SkipLayerNormalization is ~6x slower than Add + LayerNormalization: the fused export leaves
    them apart, and with the backend's disabled optimisers a CPU session doesn't fuse them again."""
    import onnx
    import onnxruntime as ort

    from encoder_runtime.backends.onnx_backend import SLOW_CPU_FUSIONS

    load_encoder(str(tiny_bert), backend="onnx", onnx_cache=tmp_path / "cache").embed(["a cat"])
    exported = tmp_path / "cache" / "embed.onnx"

    def ops_after_session(disabled) -> set[str]:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
        ort.InferenceSession(str(exported), options, ["CPUExecutionProvider"], disabled_optimizers=disabled)
        return {node.op_type for node in onnx.load(tmp_path / "optimised.onnx").graph.node}

    assert "LayerNormalization" in {node.op_type for node in onnx.load(exported).graph.node}
    assert "SkipLayerNormalization" in ops_after_session(None)  # what ORT does unless told not to
    kept_apart = ops_after_session(SLOW_CPU_FUSIONS)
    assert "SkipLayerNormalization" not in kept_apart and "LayerNormalization" in kept_apart


def test_fill_mask_head_at_mask_positions_equals_full_logits(tiny_bert):
    """The split path (encoder, then the head on mask rows only) answers as the full-logits forward does,
    on torch and on ONNX Runtime (which runs the batch a few rows at a time)."""
    split = load_fill_mask(str(tiny_bert), backend="torch")
    assert split.backend._mlm is not None
    texts = ["the [MASK] sat on the [MASK] .", "[MASK] is the capital of [MASK] ."] * 3
    items = split.encode(texts)
    reference = split.backend(split.tokenizer.pad(items))  # [b, t, V] logits at every position
    for runtime in (split, load_fill_mask(str(tiny_bert), backend="onnx")):
        for item, row, scores in zip(items, reference, runtime.run(items), strict=True):
            masks = [i for i, t in enumerate(item.ids) if t == split.mask_id]
            assert len(scores.tokens) == len(masks)
            for position, tokens, probs in zip(masks, scores.tokens, scores.scores, strict=True):
                assert tokens[0] == int(np.argmax(row[position]))
                expected = np.exp(row[position] - row[position].max())
                assert np.isclose(probs[0], (expected / expected.sum())[tokens[0]], atol=1e-4)
