"""WordPiece tokenizer training with BERT's special tokens, saved so ``AutoTokenizer`` loads it."""

from __future__ import annotations

from pathlib import Path

from encoder_training.pretraining.data import read_documents

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_tokenizer(inputs: list[str | Path], vocab_size: int, out: Path, lowercase: bool = True):
    """Train an uncased (by default) WordPiece vocabulary on the corpus; returns the fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2)
    tokenizer.train_from_iterator(read_documents(inputs), trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = BertTokenizerFast(tokenizer_object=tokenizer, do_lower_case=lowercase, model_max_length=512)
    for name, token in zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS, strict=True):
        setattr(fast, f"{name}_token", token)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast
