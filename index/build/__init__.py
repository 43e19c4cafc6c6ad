"""Corpora into new versions: reading them (``ingest``), embedding and publishing (``builder``, locally or on
Ray), and the stand-in for an encoder in collections of the caller's own vectors (``own_vectors``)."""
