"""Held-out masked-token metrics of a model being pre-trained (and of a finished one, ``cloze eval mlm``)."""

from __future__ import annotations

import torch

from encoder_training.masking import IGNORE_INDEX
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
