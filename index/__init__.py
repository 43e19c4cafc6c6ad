"""Indexing worker: documents -> chunks -> embeddings -> FAISS + SQLite (FTS5) + manifest.

The public surface is what the service uses; building blocks live in their modules (``builder``,
``store``, ``vectors``, ``layout``, ``chunking``, ``ingest``). Names are imported lazily so that
``cloze --help`` (which imports ``index.cli``) does not load FAISS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from index.records import (
        Document,
        DocumentStoreError,
        IndexModelMismatch,
        ReadOnlyIndex,
        SearchHit,
        UnknownFilterField,
    )
    from index.search_index import SearchIndex

_EXPORTS = {
    "Document": "index.records",
    "DocumentStoreError": "index.records",
    "ReadOnlyIndex": "index.records",
    "IndexModelMismatch": "index.records",
    "SearchHit": "index.records",
    "UnknownFilterField": "index.records",
    "SearchIndex": "index.search_index",
}
__all__ = [
    "Document",
    "DocumentStoreError",
    "ReadOnlyIndex",
    "IndexModelMismatch",
    "SearchHit",
    "SearchIndex",
    "UnknownFilterField",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'index' has no attribute {name!r}")
