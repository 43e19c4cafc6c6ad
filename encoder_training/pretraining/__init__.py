"""Pretraining stage of encoder training."""
