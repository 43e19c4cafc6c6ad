"""A search over an opened version: dense candidates to documents and the hybrid fusion (``ranking``), then
the hits with their text and highlights (``results``, ``highlight``)."""
