"""Held-out masked-token metrics of a model being pre-trained, and of a finished one (``cloze eval mlm``):
held-out masked-token accuracy and pseudo-perplexity.

Pseudo-perplexity (Salazar et al., 2020) masks each token of a sentence in turn and scores the
original: exp of the mean negative log-likelihood over all tokens. It is exact but costs one forward
pass per token, so it runs on a bounded sample of lines.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from encoder_training.masking import IGNORE_INDEX, MaskingConfig
from encoder_training.pretraining.data import MaskingCollator, pack_blocks, read_documents
from encoder_training.pretraining.models import ElectraPretrainer, roc_auc


@torch.no_grad()
def heldout_metrics(model: torch.nn.Module, blocks: torch.Tensor, collator, batch_size: int = 32) -> dict:
    """Masked-token accuracy and loss on held-out blocks (ELECTRA: generator and discriminator metrics)."""
    was_training = model.training
    model.eval()
    torch.manual_seed(0)  # the same masks for every evaluation of the same blocks
    device = next(model.parameters()).device
    correct = total = 0
    loss_sum = 0.0
    scores, truth = [], []
    for start in range(0, len(blocks), batch_size):
        batch = collator([{"input_ids": row} for row in blocks[start : start + batch_size]])
        batch = {k: v.to(device) for k, v in batch.items()}
        if isinstance(model, ElectraPretrainer):
            out = model(**batch)
            metrics = model.last_metrics
            n = int((batch["labels"] != IGNORE_INDEX).sum())
            correct += metrics["gen_accuracy"] * n
            total += n
            loss_sum += float(out["loss"]) * n
            scores.append(out["disc_logits"].flatten().cpu())
            truth.append(out["replaced"].flatten().cpu())
            continue
        logits = model(input_ids=batch["input_ids"]).logits
        selected = batch["labels"] != IGNORE_INDEX
        picked, gold = logits[selected].float(), batch["labels"][selected]
        correct += int((picked.argmax(-1) == gold).sum())
        loss_sum += float(torch.nn.functional.cross_entropy(picked, gold, reduction="sum"))
        total += len(gold)
    model.train(was_training)
    result = {"masked_tokens": total, "accuracy": correct / max(total, 1), "loss": loss_sum / max(total, 1)}
    if scores:
        s, t = torch.cat(scores), torch.cat(truth)
        result = {
            "masked_tokens": total,
            "generator_accuracy": correct / max(total, 1),
            "discriminator_accuracy": float(((s > 0) == t).float().mean()),
            "discriminator_auc": roc_auc(s, t),
            "replaced_fraction": float(t.float().mean()),
        }
    return result


@torch.no_grad()
def pseudo_perplexity(
    model, tokenizer, lines: list[str], max_length: int = 64, batch_size: int = 64
) -> float:
    """exp(mean over tokens of -log p(token | all other tokens)), one masked copy per token."""
    nll, count = 0.0, 0
    for line in lines:
        ids = tokenizer(line, truncation=True, max_length=max_length, return_tensors="pt")["input_ids"][0]
        positions = torch.arange(1, len(ids) - 1)
        if len(positions) == 0:
            continue
        copies = ids.repeat(len(positions), 1)
        copies[torch.arange(len(positions)), positions] = tokenizer.mask_token_id
        for start in range(0, len(copies), batch_size):
            chunk = slice(start, start + batch_size)
            logits = model(input_ids=copies[chunk]).logits
            rows = torch.arange(len(logits))
            log_probs = torch.log_softmax(logits[rows, positions[chunk]].float(), -1)
            nll -= float(log_probs[rows, ids[positions[chunk]]].sum())
        count += len(positions)
    return math.exp(nll / max(count, 1))


def evaluate_mlm(model_dir: Path, data: list[str], block_size: int = 128, ppl_lines: int = 200) -> dict:
    """Held-out masked-token accuracy (BERT masking, fixed seed) and pseudo-perplexity of a model folder."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    documents = list(read_documents(data))
    block_size = min(block_size, model.config.max_position_embeddings)
    blocks = pack_blocks(tokenizer, documents, block_size)[:256]
    collator = MaskingCollator.for_tokenizer(tokenizer, MaskingConfig(), model.config.vocab_size)
    metrics = heldout_metrics(model, blocks, collator)
    sentences = [s for d in documents for s in d.split(" . ") if len(s.split()) >= 5][:ppl_lines]
    metrics["pseudo_perplexity"] = pseudo_perplexity(model, tokenizer, sentences)
    metrics["ppl_sentences"] = len(sentences)
    return metrics
