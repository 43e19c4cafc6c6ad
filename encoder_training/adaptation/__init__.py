"""Unsupervised adaptation of a sentence encoder to a user's corpus (``cloze adapt``)."""
