"""A small reranker trained in seconds: the bundled MiniLM as a cross-encoder, fitted on a handful of judged
pairs so that its scores mean something for those queries (tests of ordering, not of quality)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

STEPS = 30

# (query, relevant passage, irrelevant passage): the irrelevant one of each query is another's relevant one.
JUDGED = [
    ("what is the capital of france", "Paris is the capital and largest city of France."),
    ("how do cats sleep", "Cats sleep for twelve to sixteen hours a day, often in short naps."),
    ("who plays the guitar", "The guitarist played a long solo on her electric guitar."),
    ("vitamin d and bone density", "Vitamin D supplements improved bone mineral density in older adults."),
    ("how fast do rivers flow", "A river flows faster where its channel is narrow and steep."),
    ("when was the printing press invented", "Gutenberg built his printing press around 1440 in Mainz."),
    ("what do bees make", "Honey bees make honey from the nectar of flowers."),
    ("why is the sky blue", "The sky looks blue because air scatters short blue wavelengths of sunlight."),
]


def judged_triples() -> list[tuple[str, str, str]]:
    return [(query, relevant, JUDGED[(i + 3) % len(JUDGED)][1]) for i, (query, relevant) in enumerate(JUDGED)]


def small_reranker() -> Path:
    """``train_small_reranker``'s model, trained once per recipe (this file's text) and kept under
    ``$CLOZE_CACHE_DIR/test-rerankers`` (default ``~/.cache/cloze-search``) with its ONNX exports: training
    takes a minute on a busy 2-core machine, every later session reuses it."""
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("CLOZE_CACHE_DIR", Path.home() / ".cache" / "cloze-search")) / "test-rerankers"
    final = root / f"minilm-judged-{recipe}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=root, prefix=".building-"))
    train_small_reranker(staged)
    shutil.rmtree(staged / "checkpoints", ignore_errors=True)
    try:
        os.rename(staged, final)
    except OSError:  # another session finished first: its copy is the same recipe
        shutil.rmtree(staged, ignore_errors=True)
    return final


def train_small_reranker(out: Path, steps: int = STEPS, seed: int = 0) -> Path:
    """The bundled encoder as a ``CrossEncoder`` trained ``steps`` steps of binary cross-entropy on
    ``JUDGED`` (each query with its passage as 1 and two others as 0), saved to ``out``."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    from sentence_transformers.cross_encoder.training_args import CrossEncoderTrainingArguments

    from encoder_runtime.model_dir import bundled_model_path

    torch.manual_seed(seed)
    model = CrossEncoder(str(bundled_model_path()), num_labels=1, device="cpu")
    rows: dict[str, list] = {"query": [], "passage": [], "label": []}
    for i, (query, relevant, other) in enumerate(judged_triples()):
        farther = JUDGED[(i + 5) % len(JUDGED)][1]
        for passage, label in ((relevant, 1.0), (other, 0.0), (farther, 0.0)):
            rows["query"].append(query)
            rows["passage"].append(passage)
            rows["label"].append(label)
    args = CrossEncoderTrainingArguments(
        output_dir=str(out / "checkpoints"),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=1e-4,
        warmup_steps=0,
        seed=seed,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = CrossEncoderTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict(rows), loss=BinaryCrossEntropyLoss(model)
    )
    trainer.train()
    model.save(str(out))
    return out
