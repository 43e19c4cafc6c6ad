"""Pre-training mechanics on a tiny config: tokenizer, packing, sparse MLM head, MLM and ELECTRA runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from encoder_training.masking import IGNORE_INDEX, MaskingConfig
from encoder_training.pretraining.data import MaskingCollator, pack_blocks, read_documents
from encoder_training.pretraining.models import ElectraPretrainer, SparseBertForMaskedLM, bert_config, roc_auc
from encoder_training.pretraining.recipes import PretrainConfig, load_recipe, recipe_names

TINY = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, block_size=32, batch_size=8)


@pytest.fixture(scope="module")
def corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 60k words of WikiText: enough for a 500-piece vocabulary and a few hundred blocks."""
    text = (shared_data / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("corpus") / "wiki.txt"
    path.write_text(text[:350_000])
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from encoder_training.pretraining.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tok")
    train_tokenizer([corpus], 500, out)
    return out


def test_tokenizer_loads_with_bert_specials(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert 400 <= len(tok) <= 500
    assert [tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id] == [
        0,
        1,
        2,
        3,
        4,
    ]
    ids = tok("The river [MASK] flows.")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and tok.mask_token_id in ids
    assert any(t.startswith("##") for t in tok.get_vocab())


def test_packing_fills_blocks_without_padding(corpus: Path, tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    docs = list(read_documents([corpus]))
    blocks = pack_blocks(tok, docs, 64)
    assert blocks.shape[1] == 64 and len(blocks) > 50
    assert (blocks[:, 0] == tok.cls_token_id).all() and (blocks[:, -1] == tok.sep_token_id).all()
    assert not (blocks == tok.pad_token_id).any()
    stream = [i for d in docs[:3] for i in tok(d, add_special_tokens=False)["input_ids"] + [tok.sep_token_id]]
    assert blocks[0, 1:-1].tolist() == stream[:62], "blocks are consecutive slices of the document stream"


@pytest.mark.parametrize("padded", [False, True])
def test_sparse_top_loss_and_gradients_equal_the_dense_model(padded: bool) -> None:
    """The sparse output layer and top encoder layer change nothing but the cost: a ragged selection (0 to
    8 labels a row) gives the loss and gradients of the stock dense ``BertForMaskedLM`` computation."""
    torch.manual_seed(0)
    model = SparseBertForMaskedLM(bert_config(100, 32, 2, 2, 64, 64)).eval()
    ids = torch.randint(5, 100, (4, 16))
    attention_mask = torch.ones_like(ids)
    if padded:
        attention_mask[1, 12:] = 0
        attention_mask[3, 9:] = 0
    labels = torch.full_like(ids, IGNORE_INDEX)
    for row, picks in enumerate([[3, 4, 5], [], [0, 2, 7, 8, 9, 10, 11, 15], [1]]):
        labels[row, picks] = ids[row, picks]

    sparse = model(input_ids=ids, attention_mask=attention_mask, labels=labels).loss
    sparse_grads = torch.autograd.grad(sparse, list(model.parameters()), allow_unused=True)
    logits = model(input_ids=ids, attention_mask=attention_mask).logits  # no labels: the stock dense path
    dense = torch.nn.functional.cross_entropy(
        logits.view(-1, 100), labels.view(-1), ignore_index=IGNORE_INDEX
    )
    dense_grads = torch.autograd.grad(dense, list(model.parameters()), allow_unused=True)

    assert torch.allclose(sparse, dense, atol=1e-5)
    for s_grad, d_grad in zip(sparse_grads, dense_grads, strict=True):
        if d_grad is None:
            continue
        assert s_grad is not None and torch.allclose(s_grad, d_grad, atol=1e-5)
    assert model(input_ids=ids, labels=labels).logits.shape == (12, 100)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the training step's precision where the CPU has bf16
        assert torch.allclose(model(input_ids=ids, labels=labels).loss.float(), dense, atol=0.05)


def test_recipes_load_and_override(tmp_path: Path) -> None:
    assert {"tiny-cpu", "small", "base"} <= set(recipe_names())
    cfg = load_recipe("tiny-cpu", {"max_steps": 7, "objective": "electra", "learning_rate": None})
    assert cfg.max_steps == 7 and cfg.objective == "electra" and cfg.learning_rate == 5e-4
    bad = tmp_path / "bad.yaml"
    bad.write_text("hidden: 3\n")
    with pytest.raises(ValueError, match="unknown fields"):
        load_recipe(str(bad))


def test_roc_auc_known_values() -> None:
    truth = torch.tensor([0, 0, 1, 1])
    assert roc_auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), truth) == 1.0
    assert roc_auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), truth) == 0.0
    assert roc_auc(torch.tensor([0.1, 0.8, 0.2, 0.9]), truth) == 0.75


def run_cli(argv: list[str]) -> dict:
    from app.cli import build_parser

    args = build_parser().parse_args(argv)
    args.handler(args)
    return json.loads((Path(args.out) / "metrics.json").read_text())


def tiny_flags(steps: int) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    return [*flags, f"--max-steps={steps}", "--warmup-steps=0", "--logging-steps=2", "--precision=fp32"]


def test_mlm_pretrain_cli_learns_and_saves_a_bert_folder(corpus: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertForMaskedLM

    out = tmp_path / "mlm"
    argv = ["train", "pretrain", "--recipe", "tiny-cpu", "--objective", "mlm", "--input", str(corpus)]
    # 40 steps: over 24 the fall was 0.12-0.2 from run to run, too close to the bar.
    flags = ["--vocab-size=500", "--learning-rate=2e-3", "--eval-steps=20", *tiny_flags(40)]
    metrics = run_cli([*argv, "--out", str(out), *flags])
    losses = [e["loss"] for e in metrics["log_history"] if "loss" in e]
    assert losses[-1] < losses[0] - 0.15, losses
    # held-out loss along the way (--eval-steps), the end's equal to the final held-out figure
    heldout = [(e["step"], e["heldout_loss"]) for e in metrics["log_history"] if "heldout_loss" in e]
    assert [step for step, _ in heldout] == [20, 40] and heldout[1][1] < heldout[0][1]
    assert heldout[1][1] == round(metrics["heldout"]["loss"], 4)
    assert metrics["steps"] == 40 and metrics["tokens_per_s"] > 0 and metrics["peak_rss_mb"] > 100
    assert 0.0 <= metrics["heldout"]["accuracy"] <= 1.0 and metrics["heldout"]["masked_tokens"] > 0
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert any(e.get("tokens_per_s") for e in metrics["log_history"])
    model = AutoModelForMaskedLM.from_pretrained(str(out))
    assert isinstance(model, BertForMaskedLM) and model.config.num_hidden_layers == 2
    tok = AutoTokenizer.from_pretrained(str(out))
    assert model(**tok("the river", return_tensors="pt")).logits.shape[-1] == len(tok)


def test_electra_pretrain_saves_discriminator_and_generator(
    corpus: Path, tokenizer_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModel, ElectraForMaskedLM, ElectraModel

    out = tmp_path / "electra"
    argv = [
        "train",
        "pretrain",
        "--objective",
        "electra",
        "--input",
        str(corpus),
        "--tokenizer",
        str(tokenizer_dir),
    ]
    metrics = run_cli([*argv, "--out", str(out), *tiny_flags(6)])
    held = metrics["heldout"]
    assert {"generator_accuracy", "discriminator_accuracy", "discriminator_auc"} <= set(held)
    assert 0.0 < held["replaced_fraction"] < 0.15, "replacements equal to the original count as original"
    assert any("disc_accuracy" in e for e in metrics["log_history"])
    encoder = AutoModel.from_pretrained(str(out))
    assert isinstance(encoder, ElectraModel) and encoder.config.hidden_size == 32
    generator = ElectraForMaskedLM.from_pretrained(str(out / "generator"))
    assert generator.config.hidden_size == 8  # a quarter of the discriminator's width
    assert torch.equal(
        generator.electra.embeddings.word_embeddings.weight, encoder.embeddings.word_embeddings.weight
    ), "generator and discriminator share token embeddings"


def test_electra_shares_embeddings_and_weights_the_discriminator() -> None:
    torch.manual_seed(0)
    model = ElectraPretrainer.build(60, 32, 2, 2, 64, 64, generator_fraction=0.25, disc_weight=50.0)
    assert model.generator.electra.embeddings is model.discriminator.electra.embeddings
    collator = MaskingCollator(4, 60, (0, 1, 2, 3, 4), torch.zeros(60, dtype=torch.bool), MaskingConfig())
    batch = collator([{"input_ids": torch.randint(5, 60, (32,))} for _ in range(4)])
    out = model(**batch)
    metrics = model.last_metrics
    assert torch.isclose(
        out["loss"], torch.tensor(metrics["gen_loss"] + 50 * metrics["disc_loss"]), rtol=1e-4
    )
    assert out["disc_logits"].shape == batch["input_ids"].shape


def test_config_rejects_unknown_objective() -> None:
    from encoder_training.pretraining.train import build_model

    with pytest.raises(ValueError):
        build_model(PretrainConfig(objective="clm", **TINY), 100)


def test_time_boxed_run_decays_the_learning_rate_to_zero_at_its_deadline(
    corpus: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    """With ``--max-time-minutes`` the clock ends the run, so the schedule follows the clock: a step-count
    schedule over ``--max-steps`` would still be at its peak when time runs out. The progress bar counts
    the budget's seconds too."""
    from encoder_training.pretraining.train import TimeBox, budget_schedule

    box = TimeBox(minutes=1.0)
    schedule = budget_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 4, box)
    assert schedule.get_last_lr() == [0.25]  # warming up: step 1 of 4, clock not started
    box.started = __import__("time").perf_counter() - 45  # three quarters of the budget gone
    for _ in range(5):
        schedule.step()
    assert schedule.get_last_lr()[0] == pytest.approx(0.25, abs=0.01)

    argv = ["train", "pretrain", "--objective", "mlm", "--input", str(corpus), "--out", str(tmp_path / "m")]
    flags = [*tiny_flags(100_000), "--vocab-size=500", "--max-time-minutes=0.1", "--learning-rate=1e-3"]
    metrics = run_cli([*argv, *flags])
    rates = [e["learning_rate"] for e in metrics["log_history"] if "learning_rate" in e]
    assert metrics["steps"] < 100_000 and len(rates) > 3
    assert rates[-1] < 0.25 * max(rates), rates
    bar = capfd.readouterr().err
    assert "/6 [" in bar and f"step={metrics['steps']}" in bar  # 0.1 minutes: a bar of 6 seconds
    assert "/100000" not in bar
