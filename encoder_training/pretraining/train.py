"""Pre-training with the Hugging Face ``Trainer`` (DDP via torchrun/accelerate, checkpoints, resume, logs).

The project supplies the data (packed blocks, dynamic masking), the models (sparse MLM head, ELECTRA)
and the artefacts beside the checkpoint: ``metrics.json`` and ``loss_curve.png``.
"""

from __future__ import annotations

import json
import math
import random
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_callback import ProgressCallback

from encoder_runtime.model_dir import bundled_model_path
from encoder_training.pretraining.data import (
    BlockDataset,
    MaskingCollator,
    masking_config,
    pack_blocks,
    read_documents,
)
from encoder_training.pretraining.fast_dropout import use_fast_dropout
from encoder_training.pretraining.heldout import heldout_metrics
from encoder_training.pretraining.models import (
    ElectraPretrainer,
    SparseBertForMaskedLM,
    bert_config,
    freeze_below_top,
)
from encoder_training.pretraining.recipes import PretrainConfig
from encoder_training.pretraining.tokenizer import train_tokenizer


def cpu_supports_bf16() -> bool:
    """Whether the CPU has native bf16 dot products (AVX512-BF16 or AMX); needed for ``--precision bf16``."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def precision_flags(precision: str) -> dict[str, bool]:
    if precision == "auto":
        if torch.cuda.is_available():
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            # On an AVX512-BF16 CPU without AMX, bf16 autocast made the tiny-cpu MLM step slower than fp32:
            # casts outweigh the faster GEMMs at this size (docs/design-decisions.md).
            precision = "fp32"
    if precision == "bf16" and not torch.cuda.is_available() and not cpu_supports_bf16():
        raise ValueError("this CPU has no native bf16: use fp32")
    if precision == "fp16" and not torch.cuda.is_available():
        raise ValueError("fp16 autocast needs CUDA; use bf16 or fp32 on CPU")
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


class Throughput(TrainerCallback):
    """Adds tokens/s (and ELECTRA's running metrics) to every log line the progress bar prints."""

    def __init__(self, tokens_per_step: int, model: torch.nn.Module):
        self.tokens_per_step = tokens_per_step
        self.model = model
        self.last = (0, time.perf_counter())
        self.started = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        step, then = self.last
        now = time.perf_counter()
        if state.global_step > step:
            logs["tokens_per_s"] = round((state.global_step - step) * self.tokens_per_step / (now - then), 1)
        logs["elapsed_s"] = round(now - self.started, 1)
        logs.update({k: round(v, 4) for k, v in getattr(self.model, "last_metrics", {}).items()})
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(logs)  # the history is a copy taken before callbacks run
        self.last = (state.global_step, now)


class HeldoutEvery(TrainerCallback):
    """Held-out loss and accuracy every ``steps`` steps, into the log history (``heldout_loss``): when the text
    is the limit, training loss keeps falling while held-out loss turns, and this shows where."""

    def __init__(self, steps: int, model: torch.nn.Module, blocks: torch.Tensor, collator):
        self.steps, self.model, self.blocks, self.collator = steps, model, blocks, collator

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.steps or not state.is_world_process_zero:
            return
        cpu_rng = torch.random.get_rng_state()  # heldout_metrics seeds its masks: training's draws go on
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        metrics = heldout_metrics(self.model, self.blocks, self.collator)
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        state.log_history.append(
            {"step": state.global_step, **{f"heldout_{k}": round(v, 4) for k, v in metrics.items()}}
        )


class TimeBox(TrainerCallback):
    """Stops training after a wall-clock budget, so a time-boxed run still saves and reports; its clock
    starts with training and also drives ``budget_schedule``."""

    def __init__(self, minutes: float):
        self.budget = minutes * 60
        self.started: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def fraction_used(self) -> float:
        if self.started is None:
            return 0.0
        return min(1.0, (time.perf_counter() - self.started) / self.budget)

    def on_step_end(self, args, state, control, **kwargs):
        if self.fraction_used() >= 1.0:
            control.should_training_stop = True


class TimeBoxProgress(ProgressCallback):
    """The progress bar of a time-boxed run counts the seconds of its budget, with the step beside them: a
    bar over ``--max-steps`` (100,000 in the benchmark) promised 11 hours for a 30-minute run."""

    def __init__(self, time_box: TimeBox):
        super().__init__()
        self.time_box = time_box

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = tqdm(total=round(self.time_box.budget), unit="s", dynamic_ncols=True)
        self.current_step = 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            elapsed = round(self.time_box.fraction_used() * self.time_box.budget)
            self.training_bar.set_postfix(step=state.global_step, refresh=False)
            self.training_bar.update(elapsed - self.training_bar.n)


def budget_schedule(optimizer, warmup_steps: int, time_box: TimeBox):
    """Linear warm-up over steps, then linear decay to zero at the end of the wall-clock budget (Cramming,
    Geiping & Goldstein 2022): a step-count schedule never decays in a run stopped by its clock."""
    from torch.optim.lr_scheduler import LambdaLR

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / max(1, warmup_steps)) * (1.0 - time_box.fraction_used())

    return LambdaLR(optimizer, factor)


class PretrainTrainer(Trainer):
    """The Trainer with a wall-clock learning-rate schedule for time-boxed runs, saving a wrapper's tied
    weights without tripping safetensors' shared-tensor check."""

    def __init__(self, *args, time_box: TimeBox | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.time_box = time_box

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.time_box is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = budget_schedule(
            optimizer or self.optimizer, self.args.warmup_steps, self.time_box
        )
        return self.lr_scheduler

    def _save(self, output_dir: str | None = None, state_dict=None):
        # a wrapper (ELECTRA's pair, the adaptation's guarded MLM) holds tied weights the plain save refuses
        if isinstance(self.model, PreTrainedModel):
            return super()._save(output_dir, state_dict)
        from safetensors.torch import save_model

        out = Path(output_dir or self.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_model(self.model, str(out / "model.safetensors"))
        torch.save(self.args, out / "training_args.bin")


def load_tokenizer(cfg: PretrainConfig, inputs: list[str], out: Path, tokenizer_dir: str | None):
    from transformers import AutoTokenizer

    if cfg.init_from:
        return AutoTokenizer.from_pretrained(str(resolve_init(cfg.init_from)))
    if tokenizer_dir:
        return AutoTokenizer.from_pretrained(tokenizer_dir)

    return train_tokenizer(inputs, cfg.vocab_size, out / "tokenizer")


def resolve_init(name: str) -> Path:
    if name == "bundled":
        return bundled_model_path()
    return Path(name)


def build_model(cfg: PretrainConfig, vocab_size: int) -> torch.nn.Module:
    """The model to train, with the CPU-fast dropout (same probabilities) swapped in."""

    model = _new_model(cfg, vocab_size)
    if cfg.dropout >= 0:
        set_dropout(model, cfg.dropout)
    return use_fast_dropout(model)


def set_dropout(model: torch.nn.Module, p: float) -> None:
    """Every dropout of ``model`` (attention reads its module's ``p``) and its config: a short continued
    pre-training run learns more per step without dropout (Cramming, Geiping & Goldstein 2022)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "hidden_dropout_prob"):
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = p


def _new_model(cfg: PretrainConfig, vocab_size: int) -> torch.nn.Module:

    shape = (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size, max(512, cfg.block_size))
    if cfg.objective == "electra":
        if cfg.init_from:
            raise ValueError("ELECTRA starts from scratch here; init_from is for MLM")
        return ElectraPretrainer.build(vocab_size, *shape, cfg.generator_fraction, cfg.disc_weight)
    if cfg.objective != "mlm":
        raise ValueError(f"objective must be mlm or electra, not {cfg.objective!r}")
    if cfg.init_from:
        model = SparseBertForMaskedLM.from_pretrained(str(resolve_init(cfg.init_from)))
        if cfg.train_top_layers:
            freeze_below_top(model, cfg.train_top_layers)
        return model
    return SparseBertForMaskedLM(bert_config(vocab_size, *shape))


def split_documents(cfg: PretrainConfig, inputs: list[str]) -> tuple[list[str], list[str]]:
    """Train and held-out paragraphs; the held-out ones are a seeded random sample."""
    documents = list(read_documents(inputs))
    random.Random(cfg.seed).shuffle(documents)
    cut = max(1, int(len(documents) * cfg.heldout_fraction))
    return documents[cut:], documents[:cut]


def training_arguments(cfg: PretrainConfig, out: Path, resume: bool) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out / "checkpoints"),
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="linear",
        logging_steps=cfg.logging_steps,
        save_steps=cfg.save_steps,
        save_total_limit=2,
        seed=cfg.seed,
        report_to="none",
        remove_unused_columns=False,
        dataloader_drop_last=True,
        ddp_find_unused_parameters=False,
        use_cpu=not torch.cuda.is_available(),
        **precision_flags(cfg.precision),
    )


def pretrain(
    cfg: PretrainConfig, inputs: list[str], out: Path, tokenizer_dir: str | None = None, resume: bool = False
) -> dict:
    """Train, save a Hugging Face folder in ``out`` and return the metrics written to ``metrics.json``."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg, inputs, out, tokenizer_dir)
    train_documents, heldout_documents = split_documents(cfg, inputs)
    train_blocks = pack_blocks(tokenizer, train_documents, cfg.block_size)
    heldout = pack_blocks(tokenizer, heldout_documents, cfg.block_size)
    set_seed(cfg.seed)  # the Trainer seeds only after the model exists: without this, its init was random
    model = build_model(cfg, len(tokenizer))
    collator = MaskingCollator.for_tokenizer(
        tokenizer, masking_config(cfg), model_vocab_size(model), train_documents
    )
    args = training_arguments(cfg, out, resume)
    tokens_per_step = cfg.batch_size * cfg.block_size * cfg.grad_accum * max(1, args.world_size)
    time_box = TimeBox(cfg.max_time_minutes) if cfg.max_time_minutes else None
    callbacks = [Throughput(tokens_per_step, model), *([time_box] if time_box else [])]
    if cfg.eval_steps and len(heldout):
        callbacks.append(HeldoutEvery(cfg.eval_steps, model, heldout, collator))
    trainer = PretrainTrainer(
        model=model,
        args=args,
        train_dataset=BlockDataset(train_blocks),
        data_collator=collator,
        callbacks=callbacks,
        time_box=time_box,
    )
    if time_box and trainer.pop_callback(ProgressCallback):
        trainer.add_callback(TimeBoxProgress(time_box))
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume or None)
    seconds = time.perf_counter() - started
    if args.world_size > 1:
        record_replica(model, out / "checkpoints", args.process_index)
        leave_process_group()
    if not trainer.is_world_process_zero():
        return {}
    save_output(model, tokenizer, out)
    metrics = {
        "objective": cfg.objective,
        "config": asdict(cfg),
        "train_blocks": len(train_blocks),
        "heldout_blocks": len(heldout),
        "steps": result.global_step,
        "train_seconds": round(seconds, 1),
        "tokens_per_s": round(result.global_step * tokens_per_step / seconds, 1),
        "final_loss": last_loss(trainer.state.log_history),
        "parameters": sum(p.numel() for p in model.parameters()),
        "peak_rss_mb": peak_rss_mb(),
        "heldout": heldout_metrics(model, heldout, collator),
        "log_history": trainer.state.log_history,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    plot_loss(trainer.state.log_history, out / "loss_curve.png", cfg.objective)
    return metrics


def peak_rss_mb() -> int:
    """This process's peak resident memory in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 2**20 if sys.platform == "darwin" else peak // 2**10  # bytes on macOS, KiB on Linux


def leave_process_group() -> None:
    """Every rank tears the process group down together: a rank that exits with gloo's threads still alive
    (while rank 0 saves) can abort at interpreter exit ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def record_replica(model: torch.nn.Module, folder: Path, rank: int) -> None:
    """Each DDP rank writes a digest of its weights, so a run can prove its replicas stayed in sync."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"weights-rank{rank}.sha256").write_text(digest.hexdigest() + "\n")


def model_vocab_size(model: torch.nn.Module) -> int:

    if isinstance(model, ElectraPretrainer):
        return model.discriminator.config.vocab_size
    return model.config.vocab_size


def save_output(model: torch.nn.Module, tokenizer, out: Path) -> None:
    """MLM: a ``BertForMaskedLM`` folder. ELECTRA: the discriminator in ``out``, the generator beside it."""

    if isinstance(model, ElectraPretrainer):
        model.discriminator.save_pretrained(out)
        model.generator.save_pretrained(out / "generator")
        tokenizer.save_pretrained(out / "generator")
    else:
        model.config.architectures = ["BertForMaskedLM"]
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def last_loss(history: list[dict]) -> float:
    losses = [entry["loss"] for entry in history if "loss" in entry]
    return losses[-1] if losses else math.nan


def plot_loss(history: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if points:
        ax.plot(*zip(*points, strict=True))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"{title} pre-training")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
