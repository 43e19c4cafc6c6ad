"""Python client of the cloze-search service (``pip install cloze-search[client]``): httpx and tqdm only,
no model, no torch. ``Client`` blocks, ``AsyncClient`` awaits; errors are ``ClozeError`` and its kinds."""

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
