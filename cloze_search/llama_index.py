"""LlamaIndex on cloze-search (``pip install "./client[llama-index]"``): a vector store and an embedding
model.

LlamaIndex embeds nodes itself (``embed_model``), so ``ClozeVectorStore`` keeps their vectors in a collection of
your own vectors (made on the first add, with the vectors' dimension) beside each node's text, which the
service also ranks by words: ``VectorStoreQueryMode.HYBRID`` fuses both (``alpha``: the vectors' weight, as a
convex fusion), ``TEXT_SEARCH`` / ``SPARSE`` rank by BM25 alone. ``ClozeEmbedding`` embeds with the service's
model (``/embed``), so no model runs in the caller's process. ``MetadataFilters`` become the service's filter
language (``to_cloze_filter``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from cloze_search.client import AsyncClient, Client, PerLoop
from cloze_search.errors import ClozeError, InvalidRequest, NotFound
from cloze_search.models import Document, Fusion, SearchResults

COMPARISONS = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
    FilterOperator.IN: "$in",
    FilterOperator.NIN: "$nin",
    FilterOperator.ANY: "$in",  # a list-valued field matches when one of its elements is one of these
}
TEXT_MODES = (VectorStoreQueryMode.TEXT_SEARCH, VectorStoreQueryMode.SPARSE)


def to_cloze_filter(filters: MetadataFilters) -> dict[str, Any]:
    """LlamaIndex's filters in the service's language. ``CONTAINS`` (a list field holds the value) is plain
    equality there; ``ALL`` is one equality per value; ``IS_EMPTY`` is a field that is absent. Text matching
    is not a filter the service has: ``ValueError``."""
    clauses = [
        to_cloze_filter(item) if isinstance(item, MetadataFilters) else _clause(item)
        for item in filters.filters
    ]
    if filters.condition == FilterCondition.OR:
        return {"$or": clauses}
    joined = clauses[0] if len(clauses) == 1 else {"$and": clauses}
    return {"$not": joined} if filters.condition == FilterCondition.NOT else joined


def _clause(item: MetadataFilter) -> dict[str, Any]:
    if item.operator in COMPARISONS:
        return {item.key: {COMPARISONS[item.operator]: item.value}}
    if item.operator == FilterOperator.CONTAINS:
        return {item.key: {"$eq": item.value}}
    if item.operator == FilterOperator.ALL:
        return {"$and": [{item.key: {"$eq": value}} for value in item.value]}  # type: ignore[union-attr]
    if item.operator == FilterOperator.IS_EMPTY:
        return {"$not": {item.key: {"$exists": True}}}
    raise ValueError(
        f"filter on {item.key!r}: operator {item.operator.value!r} has no counterpart in cloze-search"
    )


class ClozeVectorStore(BasePydanticVectorStore):
    """Nodes in a cloze-search collection of your own vectors; ``delete(ref_doc_id)`` removes a document's."""

    stores_text: bool = True
    flat_metadata: bool = False
    collection: str = "llama-index"
    metric: str = "cosine"
    _client: Client = PrivateAttr()
    _async_clients: PerLoop = PrivateAttr()

    def __init__(
        self,
        collection: str = "llama-index",
        *,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        metric: str = "cosine",
        timeout: float = 60.0,
    ):
        super().__init__(collection=collection, metric=metric)  # type: ignore[call-arg]
        self._client = Client(url, api_key=api_key, timeout=timeout)
        self._async_clients = PerLoop(url, api_key=api_key, timeout=timeout)

    @property
    def client(self) -> Client:
        return self._client

    def _async_client(self) -> AsyncClient:
        return self._async_clients.get()

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        documents = [_document(node) for node in nodes]
        try:
            self._client.upsert(documents, collection=self.collection)
        except NotFound:
            self._create(documents)
            self._client.upsert(documents, collection=self.collection)
        return [document.id for document in documents]

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        documents = [_document(node) for node in nodes]
        try:
            await self._async_client().upsert(documents, collection=self.collection)
        except NotFound:
            self._create(documents)
            await self._async_client().upsert(documents, collection=self.collection)
        return [document.id for document in documents]

    def _create(self, documents: list[Document]) -> None:
        if documents:
            dimension = len(documents[0].vector or [])
            self._client.create_collection(self.collection, dimension=dimension, metric=self.metric)

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Every node of the source document ``ref_doc_id`` (none: nothing to do)."""
        owned = self._client.list_documents(collection=self.collection, filter={"ref_doc_id": ref_doc_id})
        try:
            doomed = [document.id for document in owned]
        except (NotFound, InvalidRequest) as exc:
            _nothing_stored(exc)
            return
        for doc_id in doomed:
            self._client.delete_document(doc_id, collection=self.collection)

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        owned = self._async_client().list_documents(
            collection=self.collection, filter={"ref_doc_id": ref_doc_id}
        )
        try:
            doomed = [document.id async for document in owned]
        except (NotFound, InvalidRequest) as exc:
            _nothing_stored(exc)
            return
        for doc_id in doomed:
            await self._async_client().delete_document(doc_id, collection=self.collection)

    def get_nodes(
        self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None
    ) -> list[BaseNode]:
        """The nodes with these ids, or (none given) those ``filters`` match."""
        if node_ids is None:
            cloze_filter = to_cloze_filter(filters) if filters else None
            found = self._client.list_documents(collection=self.collection, filter=cloze_filter)
            return [_node(document.metadata, document.text) for document in found]
        nodes = []
        for node_id in node_ids:
            try:
                document = self._client.get_document(node_id, collection=self.collection)
            except NotFound:
                continue
            nodes.append(_node(document.metadata, document.text))
        return nodes

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return _result(self._client.search(query.query_str, **self._options(query)))

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return _result(await self._async_client().search(query.query_str, **self._options(query)))

    def _options(self, query: VectorStoreQuery) -> dict[str, Any]:
        clauses = [to_cloze_filter(query.filters)] if query.filters and query.filters.filters else []
        if query.doc_ids:
            clauses.append({"ref_doc_id": {"$in": list(query.doc_ids)}})
        options: dict[str, Any] = {
            "collection": self.collection,
            "top_k": query.similarity_top_k,
            "include_text": True,
            "filter": None if not clauses else clauses[0] if len(clauses) == 1 else {"$and": clauses},
        }
        if query.mode in TEXT_MODES:
            return options | {"mode": "bm25"}
        options["vector"] = query.query_embedding
        if query.mode == VectorStoreQueryMode.HYBRID:
            fusion = Fusion("convex", alpha=query.alpha) if query.alpha is not None else None
            return options | {"mode": "hybrid", "fusion": fusion}
        if query.mode != VectorStoreQueryMode.DEFAULT:
            raise ValueError(
                f"query mode {query.mode.value!r}: this store answers default, hybrid and text_search"
            )
        return options | {"mode": "dense"}


class ClozeEmbedding(BaseEmbedding):
    """Embeddings from the service's model (``/embed``, or ``/models/{model}/embed``): no model in-process."""

    model: str | None = None
    _client: Client = PrivateAttr()
    _async_clients: PerLoop = PrivateAttr()

    def __init__(
        self,
        *,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        model: str | None = None,
        timeout: float = 60.0,
        **kwargs: Any,
    ):
        super().__init__(model=model, model_name=model or "default", **kwargs)  # type: ignore[call-arg]
        self._client = Client(url, api_key=api_key, timeout=timeout)
        self._async_clients = PerLoop(url, api_key=api_key, timeout=timeout)

    def _async_client(self) -> AsyncClient:
        return self._async_clients.get()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._client.embed([query], model=self.model, truncate=True)[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._async_client().embed([query], model=self.model, truncate=True))[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._client.embed(texts, model=self.model, truncate=True)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await self._aget_query_embedding(text)


def _document(node: BaseNode) -> Document:
    """A node as a document: its text, its metadata with LlamaIndex's bookkeeping (``ref_doc_id``, the node's
    JSON) beside it, and its vector."""
    metadata = node_to_metadata_dict(node, remove_text=True, flat_metadata=False)
    return Document(node.node_id, node.get_content(), metadata, node.get_embedding())


def _nothing_stored(exc: ClozeError) -> None:
    """A delete's listing found no node: the collection is not made yet (404), or no node has a
    ``ref_doc_id`` (the service refuses a filter on a field no document has). Anything else is raised."""
    if isinstance(exc, InvalidRequest) and not (exc.field or "").startswith("filter"):
        raise exc


def _node(metadata: dict[str, Any], text: str) -> BaseNode:
    return metadata_dict_to_node(metadata, text=text)


def _result(found: SearchResults) -> VectorStoreQueryResult:
    nodes = [_node(hit.metadata, hit.text if hit.text is not None else hit.chunk) for hit in found]
    return VectorStoreQueryResult(
        nodes=nodes, similarities=[hit.score for hit in found], ids=[hit.id for hit in found]
    )
