"""The LangChain store against the session's real server: langchain-tests' standard ``VectorStoreIntegrationTests``
(sync and async) in both ways the store holds vectors (the caller's ``Embeddings`` in a collection of its own
vectors, and the service's model embedding the text), then what the standard suite leaves out: filters in the
service's language, scores, maximal marginal relevance and a hybrid retriever."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from langchain_core.documents import Document
from langchain_tests.integration_tests.vectorstores import EMBEDDING_SIZE, VectorStoreIntegrationTests

from cloze_search import Client
from cloze_search.langchain import ClozeVectorStore, maximal_marginal_relevance
from tests.e2e.conftest import WRITE_KEY


@pytest.fixture
def admin(server) -> Iterator[Client]:
    with Client(server, api_key=WRITE_KEY) as client:
        yield client


def fresh_store(server: str, admin: Client, **options) -> Iterator[ClozeVectorStore]:
    """A store on a new, empty collection, deleted afterwards (the suite wants an empty store per test)."""
    name = f"lc-{uuid.uuid4().hex[:10]}"
    embedding = options.get("embedding")
    admin.create_collection(name, dimension=EMBEDDING_SIZE if embedding else None)
    store = ClozeVectorStore(name, url=server, api_key=WRITE_KEY, **options)
    try:
        yield store
    finally:
        admin.delete_collection(name)


class TestWithTheCallersEmbeddings(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, server, admin) -> Iterator[ClozeVectorStore]:  # type: ignore[override]
        yield from fresh_store(server, admin, embedding=self.get_embeddings())


class TestWithTheServiceEmbedding(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, server, admin) -> Iterator[ClozeVectorStore]:  # type: ignore[override]
        yield from fresh_store(server, admin)


PLANETS = [
    Document("Mars is a cold desert planet with red dust.", metadata={"order": 4, "rocky": True}, id="mars"),
    Document(
        "Jupiter is a gas giant with a great red storm.", metadata={"order": 5, "rocky": False}, id="jupiter"
    ),
    Document(
        "Venus is a hot rocky planet under thick clouds.", metadata={"order": 2, "rocky": True}, id="venus"
    ),
    Document(
        "Saturn is a gas giant with bright icy rings.", metadata={"order": 6, "rocky": False}, id="saturn"
    ),
]


@pytest.fixture
def planets(server, admin) -> Iterator[ClozeVectorStore]:
    for store in fresh_store(server, admin):
        store.add_documents(PLANETS)
        yield store


def test_filters_scores_and_a_hybrid_retriever(planets):
    rocky = planets.similarity_search("a planet", k=4, filter={"rocky": True})
    assert {d.id for d in rocky} == {"mars", "venus"}
    outer = planets.similarity_search_with_score("giant planets", k=2, filter={"order": {"$gte": 5}})
    assert {d.id for d, _ in outer} == {"jupiter", "saturn"} and outer[0][1] >= outer[1][1]
    retriever = planets.as_retriever(search_kwargs={"k": 2, "mode": "hybrid"})
    assert retriever.invoke("rings of ice")[0].id == "saturn"
    relevance = planets.similarity_search_with_relevance_scores("red dust desert", k=1)
    assert relevance[0][0].id == "mars" and 0.5 < relevance[0][1] <= 1.0


def test_a_rerank_the_service_cannot_do_is_an_error_naming_the_field(planets):
    from cloze_search import InvalidRequest

    retriever = planets.as_retriever(search_kwargs={"k": 2, "rerank": 10})
    with pytest.raises(InvalidRequest) as refused:  # this server serves no reranker
        retriever.invoke("rings")
    assert refused.value.field == "rerank"


def test_maximal_marginal_relevance_trades_relevance_for_variety(planets):
    # Two gas giants are near-duplicates for this query; with diversity weighted, the second pick is not one.
    plain = planets.similarity_search("gas giant", k=2)
    varied = planets.max_marginal_relevance_search("gas giant", k=2, fetch_k=4, lambda_mult=0.1)
    assert {d.id for d in plain} == {"jupiter", "saturn"}
    assert varied[0].id in {"jupiter", "saturn"} and len({d.id for d in varied} & {"jupiter", "saturn"}) == 1


def test_mmr_picks_by_hand():
    # The first pick is the most relevant; the second, with diversity first, is the orthogonal one.
    vectors = [[1.0, 0.0], [0.99, 0.14], [0.0, 1.0]]
    assert maximal_marginal_relevance([1.0, 0.0], vectors, 2, lambda_mult=0.3) == [0, 2]
    assert maximal_marginal_relevance([1.0, 0.0], vectors, 2, lambda_mult=1.0) == [0, 1]


async def test_async_writes_and_searches_with_filters(server, admin):
    for store in fresh_store(server, admin, embedding=TestWithTheCallersEmbeddings.get_embeddings()):
        await store.aadd_documents(PLANETS)
        found = await store.asimilarity_search("Mars", k=1, filter={"order": 4})
        assert [d.id for d in found] == ["mars"]
        assert [d.id for d in await store.aget_by_ids(["venus", "pluto"])] == ["venus"]
        await store.adelete(["venus"])
        assert await store.aget_by_ids(["venus"]) == []
