"""Evaluation of encoders: masked-token accuracy, LAMA, STS."""
