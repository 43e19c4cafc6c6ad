"""The index stage: documents -> chunks -> embeddings -> FAISS + SQLite (FTS5) + manifest, and the search
over them. Its rooms, bottom to top (``pyproject.toml``'s import contracts keep the order):

- ``records``, ``faultpoints``: the values and errors the index hands out; the crash tests' named instants.
- ``text/``: how text is split into chunks and turned into search terms.
- ``storage/``: one index folder and its versions: the SQLite store, FAISS, BM25 and the filter columns
  beside it, the changelog that keeps them in step.
- ``build/`` (corpora into new versions), ``query/`` (ranking, fusion, hits) and ``archive/`` (snapshots and
  the checked restore), side by side: none imports another.
- ``collections`` (named index folders under one root) and ``search_index.SearchIndex`` (the object the
  service holds); ``replication/`` (copies on other hosts through a bucket) on top.

Import what you need from its module. These ``__init__`` files stay empty so that ``cloze --help``, which
imports ``app.cli.index``, does not load FAISS.
"""
