"""A tiny random-weight BERT for fast mechanics (tests, crash runs): worthless for quality."""

from __future__ import annotations

from pathlib import Path

TINY_WORDS = (
    "the a an is was of to in and on at for with cat dog mat sat paris france capital city river "
    "king queen man woman play plays playing guitar music read book long short sentence word words"
).split()


def make_tiny_bert(out: Path, max_position_embeddings: int = 64, hidden_size: int = 32) -> Path:
    """A 2-layer BERT with an MLM head and random weights: fast, deterministic, worthless for quality. Another
    ``hidden_size`` makes a model whose vectors say which of two served models answered."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    out.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *TINY_WORDS, *[f"##{c}" for c in "sedn"]]
    tokenizer = BertTokenizer(
        vocab={token: i for i, token in enumerate(vocab)}, model_max_length=max_position_embeddings
    )
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_position_embeddings,
    )
    BertForMaskedLM(config).eval().save_pretrained(out)
    return out


def make_tiny_cross_encoder(out: Path, base: Path) -> Path:
    """A cross-encoder folder (``CrossEncoder.save``'s layout: a one-label sequence classifier) over the tiny
    BERT ``base``, its classifier random: for the reranker's mechanics only."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    CrossEncoder(str(base), num_labels=1, device="cpu").save(str(out))
    return out


def make_thin_encoder(out: Path, base: Path, width: int = 32) -> Path:
    """``base`` (a sentence-transformers folder) at ``width`` hidden units, random weights: its tokenizer,
    pooling and layer count, so a pass makes as many torch calls as ``base``'s, each next to free on a CPU.
    That is how a GPU's pass looks from its host (launches, not arithmetic), so what the host does around
    the passes (requests, tokenising, queueing, copies, answers, the GIL) can be measured on a CPU."""
    import shutil

    import torch
    from transformers import AutoConfig, BertModel

    out.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and item.suffix not in (".safetensors", ".bin"):
            shutil.copy2(item, out / item.name)
        elif item.is_dir() and item.name != "onnx":
            shutil.copytree(item, out / item.name, dirs_exist_ok=True)
    config = AutoConfig.from_pretrained(base)
    config.hidden_size, config.intermediate_size, config.num_attention_heads = width, 2 * width, 2
    torch.manual_seed(0)
    BertModel(config).eval().save_pretrained(out)
    return out
