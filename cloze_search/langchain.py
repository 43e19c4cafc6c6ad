"""A LangChain ``VectorStore`` on a cloze-search collection (``pip install "./client[langchain]"``).

Two ways to hold vectors:

- no ``embedding``: the service embeds the text with the collection's model (``default``, or the one the
  collection was created on); searches send the query's text;
- an ``Embeddings``: the store embeds with it and keeps the vectors in a collection of your own vectors (made
  on the first write when missing, with the vectors' dimension); searches send the query's vector (and its
  text too in hybrid mode, for BM25).

Filters are the service's language (``{"year": {"$gte": 2020}}``, ``$and``/``$or``/``$not``...). Search options
ride along as keyword arguments, also through ``as_retriever(search_kwargs={...})``: ``mode`` (dense, bm25,
hybrid), ``rerank`` (candidates for a cross-encoder the service serves), ``fusion``, ``offset``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from cloze_search.client import AsyncClient, Client, PerLoop
from cloze_search.errors import NotFound
from cloze_search.models import Document as ClozeDocument
from cloze_search.models import Mode, SearchHit

SEARCH_OPTIONS = ("mode", "rerank", "fusion", "offset")


class ClozeVectorStore(VectorStore):
    def __init__(
        self,
        collection: str = "default",
        *,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        embedding: Embeddings | None = None,
        mode: Mode = "dense",
        metric: str = "cosine",
        client: Client | None = None,
        timeout: float = 60.0,
    ):
        self.collection, self.mode, self.metric = collection, mode, metric
        self._embedding = embedding
        self.client = client or Client(url, api_key=api_key, timeout=timeout)
        self._async_clients = PerLoop(url, api_key=api_key, timeout=timeout)

    @property
    def embeddings(self) -> Embeddings | None:
        return self._embedding

    @property
    def async_client(self) -> AsyncClient:
        return self._async_clients.get()

    # ---- writes ----
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        texts = list(texts)
        vectors = self._embedding.embed_documents(texts) if self._embedding and texts else None
        documents, ids = _documents(texts, metadatas, ids, vectors)
        try:
            self.client.upsert(documents, collection=self.collection)
        except NotFound:
            self._create(vectors)
            self.client.upsert(documents, collection=self.collection)
        return ids

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        texts = list(texts)
        vectors = await self._embedding.aembed_documents(texts) if self._embedding and texts else None
        documents, ids = _documents(texts, metadatas, ids, vectors)
        try:
            await self.async_client.upsert(documents, collection=self.collection)
        except NotFound:
            self._create(vectors)
            await self.async_client.upsert(documents, collection=self.collection)
        return ids

    def _create(self, vectors: list[list[float]] | None) -> None:
        """The collection, on its first write: of your own vectors with an ``Embeddings``, else on the
        service's default model."""
        dimension = len(vectors[0]) if vectors else None
        self.client.create_collection(
            self.collection, dimension=dimension, metric=self.metric if dimension else None
        )

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete these ids (those missing are skipped); every document when ``ids`` is None."""
        if ids is None:
            ids = [document.id for document in self.client.list_documents(collection=self.collection)]
        for doc_id in ids:
            try:
                self.client.delete_document(doc_id, collection=self.collection)
            except NotFound:
                continue
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        if ids is None:
            ids = [d.id async for d in self.async_client.list_documents(collection=self.collection)]
        for doc_id in ids:
            try:
                await self.async_client.delete_document(doc_id, collection=self.collection)
            except NotFound:
                continue
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        found = []
        for doc_id in ids:
            try:
                found.append(_langchain(self.client.get_document(doc_id, collection=self.collection)))
            except NotFound:
                continue
        return found

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        found = []
        for doc_id in ids:
            try:
                document = await self.async_client.get_document(doc_id, collection=self.collection)
            except NotFound:
                continue
            found.append(_langchain(document))
        return found

    # ---- searches ----
    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [document for document, _ in self.similarity_search_with_score(query, k, **kwargs)]

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [document for document, _ in await self.asimilarity_search_with_score(query, k, **kwargs)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """(document, score): cosine (or dot) in dense mode, the fused score in hybrid, the reranker's
        relevance with ``rerank``."""
        vector = self._embedding.embed_query(query) if self._embedding else None
        hits = self.client.search(query, **self._options(vector, k, filter, kwargs)).results
        return [(_from_hit(hit), hit.score) for hit in hits]

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        vector = await self._embedding.aembed_query(query) if self._embedding else None
        hits = (await self.async_client.search(query, **self._options(vector, k, filter, kwargs))).results
        return [(_from_hit(hit), hit.score) for hit in hits]

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        options = self._options(embedding, k, filter, kwargs | {"mode": "dense"})
        return [_from_hit(hit) for hit in self.client.search(None, **options)]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        options = self._options(embedding, k, filter, kwargs | {"mode": "dense"})
        return [_from_hit(hit) for hit in await self.async_client.search(None, **options)]

    def _options(
        self, vector: list[float] | None, k: int, filter: dict[str, Any] | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        chosen = {name: kwargs[name] for name in SEARCH_OPTIONS if kwargs.get(name) is not None}
        return {
            "collection": self.collection,
            "vector": vector,
            "top_k": k,
            "filter": filter or None,
            "include_text": True,
            "mode": self.mode,
        } | chosen

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Cosine similarity in [-1, 1] as a relevance in [0, 1] (dense search; other scores pass as given)."""
        return lambda score: (1.0 + score) / 2.0

    # ---- maximal marginal relevance ----
    def max_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        vector = self._embedding.embed_query(query) if self._embedding else self._service_vectors([query])[0]
        return self.max_marginal_relevance_search_by_vector(vector, k, fetch_k, lambda_mult, **kwargs)

    def max_marginal_relevance_search_by_vector(
        self, embedding: list[float], k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        """The ``fetch_k`` nearest by vector, then ``k`` of them chosen for relevance and diversity. The
        service keeps vectors to itself, so the candidates' vectors are computed again from their text (by
        the ``Embeddings``, or the service's model)."""
        candidates = self.similarity_search_by_vector(embedding, fetch_k, **kwargs)
        if not candidates:
            return []
        texts = [document.page_content for document in candidates]
        vectors = self._embedding.embed_documents(texts) if self._embedding else self._service_vectors(texts)
        return [candidates[i] for i in maximal_marginal_relevance(embedding, vectors, k, lambda_mult)]

    def _service_vectors(self, texts: list[str]) -> list[list[float]]:
        model = self.client.get_collection(self.collection).model
        return self.client.embed(texts, model=None if model == "default" else model, truncate=True)

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> ClozeVectorStore:
        """A store on ``collection`` (keyword; made when missing) holding ``texts``."""
        store = cls(embedding=embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store


def maximal_marginal_relevance(
    query: Sequence[float], vectors: Sequence[Sequence[float]], k: int, lambda_mult: float
) -> list[int]:
    """Positions of ``k`` vectors, each chosen for its cosine to the query (weight ``lambda_mult``) less its
    greatest cosine to those already chosen. In plain Python: a few dozen candidates, no numpy needed."""
    unit = [_unit(vector) for vector in vectors]
    relevance = [_dot(_unit(query), vector) for vector in unit]
    chosen: list[int] = []
    while len(chosen) < min(k, len(unit)):

        def value(i: int) -> float:
            redundancy = max((_dot(unit[i], unit[j]) for j in chosen), default=0.0)
            return lambda_mult * relevance[i] - (1 - lambda_mult) * redundancy

        chosen.append(max((i for i in range(len(unit)) if i not in chosen), key=value))
    return chosen


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _unit(vector: Sequence[float]) -> list[float]:
    norm = _dot(vector, vector) ** 0.5 or 1.0
    return [x / norm for x in vector]


def _documents(
    texts: list[str],
    metadatas: list[dict] | None,
    ids: list[str] | None,
    vectors: list[list[float]] | None,
) -> tuple[list[ClozeDocument], list[str]]:
    ids = [str(doc_id) if doc_id else str(uuid.uuid4()) for doc_id in ids] if ids else []
    ids += [str(uuid.uuid4()) for _ in range(len(texts) - len(ids))]
    metadatas = metadatas or [{} for _ in texts]
    rows: list[list[float] | None] = list(vectors) if vectors else [None] * len(texts)
    documents = [
        ClozeDocument(doc_id, text, dict(metadata or {}), vector)
        for doc_id, text, metadata, vector in zip(ids, texts, metadatas, rows, strict=True)
    ]
    return documents, ids


def _langchain(document: ClozeDocument) -> Document:
    return Document(page_content=document.text, metadata=document.metadata, id=document.id)


def _from_hit(hit: SearchHit) -> Document:
    return Document(
        page_content=hit.text if hit.text is not None else hit.chunk, metadata=hit.metadata, id=hit.id
    )
