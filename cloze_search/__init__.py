"""Python client of the cloze-search service (distribution ``cloze-search-client``: ``pip install ./client``):
httpx only, no model, no torch. ``Client`` blocks, ``AsyncClient`` awaits; errors are ``ClozeError`` and its
kinds.

The names below are imported on first use (PEP 562), not with the package: ``cloze --help`` and ``cloze-client
--help`` import ``cloze_search.cli`` and so this file, and should not pay for httpx to print their help."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cloze_search.client import AsyncClient, Client
    from cloze_search.errors import (
        ClozeError,
        Conflict,
        ConnectionFailed,
        InvalidRequest,
        NotFound,
        Overloaded,
        Unauthorized,
    )
    from cloze_search.models import (
        Collection,
        Document,
        Explanation,
        Fusion,
        Job,
        Prediction,
        Rerank,
        RerankResult,
        Restored,
        SearchHit,
        SearchResults,
        Snapshot,
    )

__all__ = [
    "AsyncClient",
    "Client",
    "ClozeError",
    "Collection",
    "Conflict",
    "ConnectionFailed",
    "Document",
    "Explanation",
    "Fusion",
    "InvalidRequest",
    "Job",
    "NotFound",
    "Overloaded",
    "Prediction",
    "Rerank",
    "RerankResult",
    "Restored",
    "SearchHit",
    "SearchResults",
    "Snapshot",
    "Unauthorized",
]
_HOMES = ("errors", "models", "client")  # looked in in this order: only ``client`` imports httpx


def __getattr__(name: str) -> Any:
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(f"cloze_search.{home}")
            if hasattr(module, name):
                globals()[name] = value = getattr(module, name)  # looked up once
                return value
    raise AttributeError(f"module 'cloze_search' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
