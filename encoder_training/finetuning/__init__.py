"""Finetuning stage of encoder training."""
