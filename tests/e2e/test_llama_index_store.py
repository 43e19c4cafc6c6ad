"""LlamaIndex end to end over the session's real server: ``VectorStoreIndex`` with the store (a collection of own
vectors) and ``ClozeEmbedding`` (the bundled MiniLM, served), then retrieval in default, hybrid and text modes,
``MetadataFilters`` mapped to the service's filters, and a document deleted by its ``ref_doc_id``."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.vector_stores import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from cloze_search import Client
from cloze_search.llama_index import ClozeEmbedding, ClozeVectorStore, to_cloze_filter
from tests.e2e.conftest import WRITE_KEY

RECIPES = [
    Document(text="Knead the dough, let it rise, then bake the bread in a hot oven.", doc_id="bread",
             metadata={"course": "baking", "minutes": 180}),
    Document(text="Whisk eggs with sugar and fold in flour for a light sponge cake.", doc_id="sponge",
             metadata={"course": "baking", "minutes": 45}),
    Document(text="Simmer tomatoes, garlic and basil into a sauce for the pasta.", doc_id="pasta",
             metadata={"course": "main", "minutes": 30}),
    Document(text="Grill the salmon fillets and serve them with lemon and dill.", doc_id="salmon",
             metadata={"course": "main", "minutes": 20}),
]  # fmt: skip


@pytest.fixture(scope="module")
def index(server) -> VectorStoreIndex:
    store = ClozeVectorStore("llama-recipes", url=server, api_key=WRITE_KEY)
    # Words for tokens: LlamaIndex's default tokenizer (tiktoken) would fetch its vocabulary from the internet.
    splitter = SentenceSplitter(chunk_size=256, chunk_overlap=0, tokenizer=str.split)
    return VectorStoreIndex.from_documents(
        RECIPES,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=ClozeEmbedding(url=server, api_key=WRITE_KEY),
        transformations=[splitter],
    )


def ref_ids(nodes) -> list[str]:
    return [node.node.ref_doc_id for node in nodes]


def test_retrieval_in_each_mode(index, server):
    with Client(server, api_key=WRITE_KEY) as client:
        made = client.get_collection("llama-recipes")
    assert made.model is None and made.dimension == 384 and made.documents == 4  # own vectors, one per node
    assert ref_ids(index.as_retriever(similarity_top_k=1).retrieve("baking a loaf of bread")) == ["bread"]
    hybrid = index.as_retriever(similarity_top_k=2, vector_store_query_mode="hybrid", alpha=0.5)
    assert ref_ids(hybrid.retrieve("fish with lemon"))[0] == "salmon"
    words = index.as_retriever(similarity_top_k=4, vector_store_query_mode="text_search")
    assert ref_ids(words.retrieve("garlic")) == ["pasta"]  # BM25: only one text has the word


def test_metadata_filters(index):
    quick_mains = MetadataFilters(
        filters=[
            MetadataFilter(key="course", value="main"),
            MetadataFilter(key="minutes", value=25, operator=FilterOperator.LT),
        ]
    )
    retriever = index.as_retriever(similarity_top_k=4, filters=quick_mains)
    assert ref_ids(retriever.retrieve("dinner")) == ["salmon"]
    either = MetadataFilters(
        filters=[MetadataFilter(key="minutes", value=100, operator=FilterOperator.GT),
                 MetadataFilter(key="course", value=["main"], operator=FilterOperator.IN)],
        condition=FilterCondition.OR,
    )  # fmt: skip
    assert set(ref_ids(index.as_retriever(similarity_top_k=4, filters=either).retrieve("food"))) == {
        "bread", "pasta", "salmon",
    }  # fmt: skip
    assert to_cloze_filter(either) == {"$or": [{"minutes": {"$gt": 100}}, {"course": {"$in": ["main"]}}]}
    negated = MetadataFilters(
        filters=[MetadataFilter(key="course", value="baking")], condition=FilterCondition.NOT
    )
    assert to_cloze_filter(negated) == {"$not": {"course": {"$eq": "baking"}}}
    with pytest.raises(ValueError, match="text_match"):
        to_cloze_filter(MetadataFilters(filters=[MetadataFilter(key="c", value="x", operator="text_match")]))


def test_async_query_and_delete_by_ref_doc_id(index):
    retriever = index.as_retriever(similarity_top_k=4)
    assert "sponge" in ref_ids(asyncio.run(retriever.aretrieve("cake")))
    index.delete_ref_doc("sponge")
    assert "sponge" not in ref_ids(retriever.retrieve("cake"))
    index.vector_store.delete("no-such-document")  # nothing of it stored: nothing to do
    assert len(ref_ids(retriever.retrieve("cake"))) == 3
