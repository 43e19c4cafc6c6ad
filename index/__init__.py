"""Indexing worker: documents -> chunks -> embeddings -> FAISS + SQLite (FTS5) + manifest.

Import what you need from its module: ``search_index.SearchIndex`` (what the service holds), ``records``
(the values and errors it hands out), ``builder`` (batch builds), ``layout`` (the index directory). This
file stays empty so that ``cloze --help``, which imports ``index.cli``, does not load FAISS.
"""
