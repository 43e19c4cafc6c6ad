"""Stage 1: continued masked-language-model pre-training of the encoder on the corpus (domain-adaptive
pre-training; Gururangan et al. 2020), so the adapted encoder is MLM-derived in fact.

A sentence encoder such as all-MiniLM-L6-v2 ships without an MLM head. For the bundled model the head
of this project's fill-mask model (``encoder_runtime/models/fill-mask-delta``) is put on top: a warm start
rather than a match, since that model's six layers were trained on from these weights; any other
encoder keeps the head its folder has, or gets a fresh one.
The encoder's own weights are the starting model's, unchanged: only the head comes from elsewhere.

With ``mlm_distill_weight`` above zero the stage is guarded (``GuardedMaskedLM``): besides predicting the
masked tokens, each block's pooled embedding, computed from its masked input, is pulled toward the
starting encoder's embedding of the same block unmasked. Plain MLM moves the encoder away from the
sentence-embedding space it was trained for (the MLM-only ablation lost 0.029 dense nDCG@10 on SciFact,
docs/adapt.md); the pull keeps it there while MLM adapts its token representations to the corpus.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import TrainingArguments, set_seed
from transformers.modeling_outputs import MaskedLMOutput

from encoder_runtime.default_fill_mask import DELTA_DIR
from encoder_runtime.model_dir import fingerprint
from encoder_training.adaptation.recipe import AdaptConfig
from encoder_training.adaptation.timing import ResumableTimeBox, RunState, train_resuming
from encoder_training.masking import IGNORE_INDEX, MaskingConfig
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


def embedding_head(model_dir: Path) -> nn.Module:
    """The modules a sentence-transformers folder puts after its Transformer (pooling, normalisation,
    any dense layer), frozen: they turn token states into the sentence embedding as the model defines it."""
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    head = nn.Sequential(*(encoder[i] for i in range(1, len(encoder))))
    return head.eval().requires_grad_(False)


class GuardedMaskedLM(nn.Module):
    """MLM loss plus ``weight`` times the squared distance of each block's embedding (from its masked
    input) from the starting encoder's embedding of the block unmasked. The starting encoder is a frozen
    copy and ``head`` the model's own pooling modules; neither is a submodule, so checkpoints hold the
    trained model only and the optimiser never sees them. For unit vectors the distance is 2(1 - cos)."""

    # a checkpoint keeps one name of each tied pair (safetensors' save_model): on resume the Trainer finds
    # these missing and calls ``tie_weights`` instead of warning
    _keys_to_ignore_on_save = [f"mlm.{key}" for key in SparseBertForMaskedLM._tied_weights_keys]

    def __init__(self, mlm: SparseBertForMaskedLM, weight: float, head: nn.Module):
        super().__init__()
        self.mlm, self.weight = mlm, weight
        self.__dict__["teacher"] = copy.deepcopy(mlm.bert).eval().requires_grad_(False)
        self.__dict__["head"] = head

    def tie_weights(self) -> None:
        self.mlm.tie_weights()

    def _apply(self, fn, recurse=True):
        # ``.to(device)`` by the Trainer moves the frozen parts too, once, not on every step
        for frozen in (self.teacher, self.head):
            frozen._apply(fn, recurse)
        return super()._apply(fn, recurse)

    def embed(self, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        features = {"token_embeddings": states.float(), "attention_mask": attention_mask}
        return self.head(features)["sentence_embedding"]

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **_):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        states = self.mlm.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        selected = labels != IGNORE_INDEX
        logits = self.mlm.cls(states[selected])
        loss = F.cross_entropy(logits.float(), labels[selected])
        with torch.no_grad():
            clean = torch.where(selected, labels, input_ids)
            target = self.teacher(
                input_ids=clean, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            target = self.embed(target, attention_mask)
        distance = (self.embed(states, attention_mask) - target).pow(2).sum(-1).mean()
        self.last_metrics = {"mlm_loss": loss.item(), "distance": distance.item()}  # logged by Throughput
        return MaskedLMOutput(loss=loss + self.weight * distance, logits=logits)


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
    mlm, head = load_mlm(start)
    mlm = use_fast_dropout(mlm)
    model: nn.Module = mlm
    if config.mlm_distill_weight:
        model = GuardedMaskedLM(mlm, config.mlm_distill_weight, embedding_head(start))
    blocks = pack_blocks(tokenizer, texts, config.mlm_block_size)
    masking = MaskingConfig(strategy=config.mlm_masking, rate=config.mlm_rate)
    collator = MaskingCollator.for_tokenizer(tokenizer, masking, mlm.config.vocab_size, texts)
    time_box = ResumableTimeBox(minutes, state, "mlm")
    args = TrainingArguments(
        output_dir=str(stage_dir / "checkpoints"),
        max_steps=config.max_steps_per_stage or 1_000_000,  # else the clock stops it
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
    missing, unexpected = encoder[0].auto_model.load_state_dict(mlm.bert.state_dict(), strict=False)
    if unexpected or any(not key.startswith("pooler.") for key in missing):
        raise RuntimeError(f"MLM encoder does not fit the sentence encoder: {missing} {unexpected}")
    encoder.save(str(out))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    record = {
        "head": head,
        "distill_weight": config.mlm_distill_weight,
        "blocks": len(blocks),
        "steps": result.global_step,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(result.global_step * tokens_per_step / max(seconds, 1e-9), 1),
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
    }
    log.info("MLM stage: %s", record)
    return out, record
