"""Stage 1: continued masked-language-model pre-training of the encoder on the corpus (domain-adaptive
pre-training; Gururangan et al. 2020), so the adapted encoder is MLM-derived in fact.

A sentence encoder such as all-MiniLM-L6-v2 ships without an MLM head. For the bundled model the head
of this project's fill-mask model (``encoder_runtime/models/fill-mask-delta``, trained over exactly
these weights) is put on top; any other encoder keeps the head its folder has, or gets a fresh one.
The encoder's own weights are the starting model's, unchanged: only the head comes from elsewhere.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import TrainingArguments, set_seed

from encoder_runtime.default_fill_mask import DELTA_DIR
from encoder_runtime.model_dir import fingerprint
from encoder_training.adaptation.recipe import AdaptConfig
from encoder_training.adaptation.timing import ResumableTimeBox, RunState, train_resuming
from encoder_training.masking import MaskingConfig
from encoder_training.pretraining.data import BlockDataset, MaskingCollator, pack_blocks
from encoder_training.pretraining.delta import HEAD_KEYS
from encoder_training.pretraining.fast_dropout import use_fast_dropout
from encoder_training.pretraining.models import SparseBertForMaskedLM
from encoder_training.pretraining.train import PretrainTrainer, Throughput

log = logging.getLogger(__name__)


def transformer_folder(model_dir: Path) -> Path:
    """The Hugging Face folder of a sentence-transformers model's first (Transformer) module."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return model_dir
    for module in json.loads(modules.read_text()):
        if module.get("type", "").endswith("Transformer"):
            return model_dir / module.get("path", "")
    raise ValueError(f"{model_dir} has no Transformer module")


def load_mlm(model_dir: Path) -> tuple[SparseBertForMaskedLM, str]:
    """The encoder with an MLM head on top, and where the head came from."""
    folder = transformer_folder(model_dir)
    model = SparseBertForMaskedLM.from_pretrained(str(folder))
    head = "fresh"
    state = {}
    manifest = DELTA_DIR / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text())["base_fingerprint"] == fingerprint(model_dir):
        from safetensors.torch import load_file

        state = {
            k: v.float() for k, v in load_file(str(DELTA_DIR / "delta.safetensors")).items() if k in HEAD_KEYS
        }
        head = "fill-mask-delta"
    else:
        weights = folder / "model.safetensors"
        if weights.is_file():
            from safetensors.torch import load_file

            state = {k: v for k, v in load_file(str(weights)).items() if k in HEAD_KEYS}
            head = "own" if state else head
    if state:
        missing = set(HEAD_KEYS) - set(state)
        if missing:
            raise ValueError(f"MLM head incomplete, missing {sorted(missing)}")
        model.load_state_dict(state, strict=False)
    return model, head


def run_mlm(
    config: AdaptConfig, start: Path, texts: list[str], work: Path, minutes: float, state: RunState
) -> tuple[Path, dict]:
    """Train for ``minutes`` (resuming from ``work/mlm/checkpoints``), save a sentence-transformers folder."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    stage_dir = work / "mlm"
    out = stage_dir / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(transformer_folder(start)))
    set_seed(config.seed)
    model, head = load_mlm(start)
    model = use_fast_dropout(model)
    blocks = pack_blocks(tokenizer, texts, config.mlm_block_size)
    masking = MaskingConfig(strategy=config.mlm_masking, rate=config.mlm_rate)
    collator = MaskingCollator.for_tokenizer(tokenizer, masking, model.config.vocab_size, texts)
    time_box = ResumableTimeBox(minutes, state, "mlm")
    args = TrainingArguments(
        output_dir=str(stage_dir / "checkpoints"),
        max_steps=1_000_000,  # the clock stops it
        per_device_train_batch_size=config.mlm_batch_size,
        learning_rate=config.mlm_learning_rate,
        warmup_steps=config.mlm_warmup_steps,
        weight_decay=0.01,
        logging_steps=10,
        save_steps=100,
        save_total_limit=1,
        seed=config.seed,
        report_to="none",
        remove_unused_columns=False,
        dataloader_drop_last=True,
        use_cpu=not torch.cuda.is_available(),
    )
    tokens_per_step = config.mlm_batch_size * config.mlm_block_size
    trainer = PretrainTrainer(
        model=model,
        args=args,
        train_dataset=BlockDataset(blocks),
        data_collator=collator,
        callbacks=[Throughput(tokens_per_step, model), time_box],
        time_box=time_box,
    )
    result, seconds = train_resuming(trainer, time_box, stage_dir)
    encoder = SentenceTransformer(str(start), local_files_only=True)
    missing, unexpected = encoder[0].auto_model.load_state_dict(model.bert.state_dict(), strict=False)
    if unexpected or any(not key.startswith("pooler.") for key in missing):
        raise RuntimeError(f"MLM encoder does not fit the sentence encoder: {missing} {unexpected}")
    encoder.save(str(out))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    record = {
        "head": head,
        "blocks": len(blocks),
        "steps": result.global_step,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(result.global_step * tokens_per_step / max(seconds, 1e-9), 1),
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
    }
    log.info("MLM stage: %s", record)
    return out, record
