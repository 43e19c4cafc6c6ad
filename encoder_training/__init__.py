"""Encoder training: tokenizer, masking, MLM / ELECTRA pre-training, SBERT fine-tuning, export, evaluation."""
