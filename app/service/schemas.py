"""Request and response bodies. Limits that depend on settings are checked in the routes (``limits.py``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from encoder_runtime.fill_mask import MAX_TOP_K

Text = str
# A list stops at its first bad item: a body of 100,000 wrong values makes one error, not 100,000.
TextList = Annotated[list[Text], Field(fail_fast=True)]
IdList = Annotated[list[int], Field(fail_fast=True)]
SearchMode = Literal["dense", "bm25", "hybrid"]
FILTER_DESCRIPTION = """Metadata filter, applied before ranking in every mode (so top_k counts matching documents only).
MongoDB / Chroma shape; all entries of an object must hold.

- `{"field": value}`: equality (a list-valued field matches when one element equals it); `{"field": [v1, v2]}`: any of.
- `$eq`, `$ne`: `{"lang": {"$ne": "de"}}`. `$in`, `$nin`: `{"tag": {"$in": ["a", "b"]}}`.
- `$gt`, `$gte`, `$lt`, `$lte`: numbers as numbers, ISO-8601 dates and date-times as instants (no offset means UTC;
  a date is its midnight UTC): `{"year": {"$gte": 2000, "$lt": 2010}}`, `{"published": {"$gte": "2024-01-01T00:00:00Z"}}`.
  A bound that is neither is a 422 naming the field, never a string comparison; a `null` bound matches nothing.
- Dates are instants in every operator: `{"published": "2024-01-01"}` also matches `"2024-01-01T02:00:00+02:00"`.
- `$exists`: `{"doi": {"$exists": true}}`. `$not` on a field: `{"year": {"$not": {"$lt": 1900}}}`.
- `$and`, `$or` (non-empty lists of filters), `$not` (a filter): `{"$or": [{"tag": "covid"}, {"year": {"$gt": 2019}}]}`.

Equality is typed (1 matches 1 and 1.0, never true or "1"); `$ne`, `$nin` and `$not` also match documents without
the field. A field no document has matches nothing (MongoDB's reading; CLOZE_STRICT_FILTER_FIELDS makes it a 422). Bounded: 8 levels of nesting, 256 clauses, 1024 values per list, and CLOZE_MAX_FILTER_VALUES fields and
values in all; past a bound, 422 naming the field (`filter.<path>`)."""
FILTER_EXAMPLES = [
    {"year": {"$gte": 2000}},
    {"$or": [{"tag": "covid"}, {"year": {"$gt": 2019, "$lte": 2023}}]},
    {"published": {"$gte": "2024-01-01", "$lt": "2024-07-01T00:00:00+02:00"}, "lang": {"$nin": ["de", "fr"]}},
    {"$not": {"doi": {"$exists": True}}, "tag": ["a", "b"]},
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI's shape; unknown fields (``user``...) are accepted and ignored, as OpenAI clients send them."""

    input: Text | TextList
    model: str | None = Field(
        None,
        description="With CLOZE_MODELS: a served model's name or alias (GET /models), absent = `default`; an "
        "unknown one is a 404 listing the served models. Without it: ignored, the one model answers",
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


TruncationDirection = Literal["right", "left"]


class EmbedRequest(Strict):
    """TEI's ``/embed`` (what ``huggingface_hub.InferenceClient.feature_extraction`` sends)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"inputs": ["What is deep learning?"], "normalize": True}]},
    )

    inputs: Text | TextList
    normalize: bool = True
    truncate: bool = Field(False, description="Cut inputs over the model's window instead of refusing them")
    truncation_direction: TruncationDirection = Field(
        "right", description="Which end truncate=true cuts from"
    )
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first N dimensions (Matryoshka), then normalise if normalize"
    )
    prompt_name: str | None = Field(None, description="Refused: this service's models define no prompts")
    encoding_format: Literal["float"] = Field(
        "float", description="Only float here; /v1/embeddings answers base64 too"
    )


class SimilarityInput(Strict):
    source_sentence: Text
    sentences: TextList


class SimilarityParameters(Strict):
    truncate: bool = False
    truncation_direction: TruncationDirection = "right"
    prompt_name: str | None = None


class SimilarityRequest(Strict):
    """TEI's ``/similarity`` (what ``InferenceClient.sentence_similarity`` sends): cosine of the embeddings."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "inputs": {
                        "source_sentence": "A man is playing a guitar.",
                        "sentences": ["Someone plays an instrument.", "The stock market fell."],
                    }
                }
            ]
        },
    )

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class TokenizeRequest(Strict):
    """TEI's ``/tokenize``: the model's tokens with their character offsets, no truncation."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"inputs": "Hello world"}]})

    inputs: Text | TextList
    add_special_tokens: bool = True
    prompt_name: str | None = None


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class DecodeRequest(Strict):
    """TEI's ``/decode``: token ids (one list, or a list of lists) back to text."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"ids": [101, 7592, 2088, 102]}]}
    )

    ids: IdList | Annotated[list[IdList], Field(fail_fast=True)]
    skip_special_tokens: bool = True


class FillMaskParameters(Strict):
    top_k: int = Field(5, ge=1, le=MAX_TOP_K)
    targets: list[str] | None = Field(None, min_length=1, max_length=50)


class FillMaskRequest(Strict):
    """The Hugging Face inference shape (what ``InferenceClient.fill_mask`` sends)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"inputs": "Paris is the capital of [MASK].", "parameters": {"top_k": 3}},
                {"inputs": ["The [MASK] sat on the [MASK]."], "nested": True},
            ]
        },
    )

    inputs: Text | TextList
    parameters: FillMaskParameters = Field(default_factory=FillMaskParameters)
    nested: bool = Field(
        False,
        description="This service's extension: always answer [input][mask][prediction], however many "
        "inputs and masks (default: the pipeline's nesting)",
    )

    @model_validator(mode="before")
    @classmethod
    def _parameters_go_in_parameters(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name in ("top_k", "targets"):
                if name in value:
                    raise ValueError(
                        f"{name}: send it as parameters.{name} (the Hugging Face inference shape)"
                    )
        return value


class Prediction(BaseModel):
    score: float
    token: int
    token_str: str
    sequence: str


class RerankRequest(Strict):
    """TEI's ``/rerank``: each of ``texts`` scored against ``query`` by a cross-encoder, best first."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "query": "What is the capital of France?",
                    "texts": ["Paris is the capital of France.", "Berlin is a city in Germany."],
                    "return_text": True,
                }
            ]
        },
    )

    query: Text
    texts: TextList
    raw_scores: bool = Field(False, description="The model's logits instead of their sigmoid (0..1)")
    return_text: bool = Field(False, description="Give each result its text")
    truncate: bool = Field(
        False,
        description="Cut a pair over the model's window on the document side instead of refusing it (a query "
        "is always cut to half the window)",
    )
    truncation_direction: Literal["right", "Right", "left", "Left"] = Field(
        "right", description="Only the end of a document is cut (`right`)"
    )


class RerankResult(BaseModel):
    index: int = Field(description="the text's position in the request")
    score: float
    text: str | None = None


class CohereDocument(BaseModel):
    """A Cohere v1 document object: ``text`` is scored; other fields come back as sent."""

    model_config = ConfigDict(extra="allow")
    text: Text


class CohereRerankRequest(BaseModel):
    """Cohere's rerank (``cohere.Client.rerank`` -> ``/v1/rerank``, ``cohere.ClientV2.rerank`` ->
    ``/v2/rerank``). Fields of Cohere's that change nothing here (``max_chunks_per_doc``,
    ``max_tokens_per_doc``, ``priority``) and unknown ones are accepted and ignored, as Cohere clients of
    other versions send them."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "model": "default",
                    "query": "What is the capital of France?",
                    "documents": ["Paris is the capital of France.", "Berlin is a city in Germany."],
                    "top_n": 1,
                }
            ]
        },
    )

    model: str | None = Field(
        None,
        description="A reranker's name or alias (GET /models, `rerank_models`); absent: `default` if served, "
        "else the first of CLOZE_RERANK_MODELS. An unknown one is a 404 listing the served ones",
    )
    query: Text
    documents: Annotated[list[Text | CohereDocument], Field(fail_fast=True)]
    top_n: int | None = Field(None, ge=1, description="Return the best N (default: all)")
    return_documents: bool = Field(False, description="Give each result its `document` ({text, ...})")
    rank_fields: list[str] | None = Field(None, description='Only `["text"]`: the field that is scored')
    max_chunks_per_doc: int | None = None
    max_tokens_per_doc: int | None = None
    priority: int | None = None


class RerankIn(Strict):
    """Search's second stage: a cross-encoder re-scores the first stage's best candidates."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"candidates": 50}, {"candidates": 100, "model": "legal"}]},
    )
    candidates: int = Field(
        50,
        ge=1,
        description="How many of the first stage's best documents (any mode) the reranker re-scores; at least "
        "offset + top_k, at most CLOZE_MAX_RERANK_CANDIDATES",
    )
    model: str | None = Field(
        None, description="A reranker's name (GET /models); absent: `default`, else the first served"
    )
    text: Literal["document", "chunk"] = Field(
        "document",
        description="What is scored against the query: the document's text (the reranker reads as much as "
        "its window holds), or the hit's matching chunk (for documents longer than the window)",
    )


class FusionIn(Strict):
    """How hybrid search merges its dense and BM25 lists."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"method": "rrf", "k": 60}, {"method": "convex", "alpha": 0.5}]},
    )
    method: Literal["rrf", "convex"] = Field(
        "rrf",
        description="`rrf`: reciprocal rank fusion, a hit scores the sum over lists of 1 / (k + rank). `convex`: "
        "alpha x dense + (1 - alpha) x BM25, each score min-max normalised over its own candidate list (0 when "
        "the hit is not in that list). Each list holds max(30, 3 x (offset + top_k)) candidates, so a top 10 may "
        "shift with top_k, a convex one more than an RRF one",
    )
    k: int | None = Field(
        None, ge=1, le=1_000_000, description="RRF's constant (rrf only; default 60)", examples=[60]
    )
    alpha: float | None = Field(
        None, ge=0.0, le=1.0, description="the dense list's weight (convex only; default 0.5)", examples=[0.5]
    )


class SearchRequest(Strict):
    query: str | None = Field(
        None,
        min_length=1,
        description="The query's text: needed by modes bm25 and hybrid, and by dense unless `vector` is given",
    )
    vector: list[float] | None = Field(
        None,
        max_length=8192,
        description="The query's own vector, instead of embedding `query` (the collection's dimension; modes "
        "dense and hybrid). Needed in a collection of your own vectors; without `query` the mode is dense",
    )
    top_k: int = Field(10, ge=1)
    offset: int = Field(
        0,
        ge=0,
        description="Skip this many results: a page is results offset..offset+top_k of the ranking a search with "
        "top_k = offset + top_k returns; offset + top_k is at most 1000",
    )
    mode: SearchMode = "hybrid"
    filter: dict[str, Any] | None = Field(None, description=FILTER_DESCRIPTION, examples=FILTER_EXAMPLES)
    include_text: bool = False
    highlight: bool = Field(
        False,
        description="Return each hit's `highlights`: the spans of `chunk` holding a query term, as BM25 matches "
        "terms (lower-cased words, English stems, stop words never)",
        examples=[True],
    )
    fusion: FusionIn | None = Field(
        None,
        description="Hybrid mode only: how the dense and BM25 lists are merged (default RRF with k = 60)",
        examples=[{"method": "rrf", "k": 60}, {"method": "convex", "alpha": 0.5}],
    )
    explain: bool = Field(
        False,
        description="Return each hit's `explain`: its dense and BM25 score and rank, and the score it was ranked by",
        examples=[True],
    )
    rerank: RerankIn | None = Field(
        None,
        description="Re-score the first stage's best `candidates` with a cross-encoder (CLOZE_RERANK_MODELS) "
        "and return its top_k: each hit's `score` is then the reranker's relevance (0..1)",
        examples=[{"candidates": 50}],
    )

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"query": "vitamin D and bone density", "mode": "hybrid", "top_k": 5},
                {
                    "query": "running dogs",
                    "mode": "hybrid",
                    "highlight": True,
                    "explain": True,
                    "fusion": {"method": "convex", "alpha": 0.5},
                },
            ]
        },
    )


class SearchExplanation(BaseModel):
    """Where a hit stood in each ranked list; null where it was not in that list (or the mode ran none)."""

    dense_score: float | None = Field(description="cosine of the hit's best chunk to the query")
    dense_rank: int | None = Field(description="1-based place in the dense list")
    bm25_score: float | None = Field(description="BM25 score of the document")
    bm25_rank: int | None = Field(description="1-based place in the BM25 list")
    fused_score: float = Field(description="the first stage's score (the hit's `score` unless reranked)")
    rerank_score: float | None = Field(
        None, description="with `rerank`: the reranker's relevance (0..1), the score the hit was ranked by"
    )
    first_stage_rank: int | None = Field(
        None, description="with `rerank`: the hit's 1-based place in the first stage's ranking"
    )


class SearchResult(BaseModel):
    id: str
    score: float
    text: str | None = Field(None, description="With `include_text`: the document's whole text")
    chunk: str
    chunk_index: int
    metadata: dict[str, Any]
    highlights: list[tuple[int, int]] | None = Field(
        None,
        description="With `highlight`: [start, end) offsets in `chunk`, in Unicode code points, sorted, of the "
        "words that match a query term",
        examples=[[[0, 7], [8, 12]]],
    )
    explain: SearchExplanation | None = Field(None, description="With `explain`: how the hit was ranked")


class SearchResponse(BaseModel):
    results: list[SearchResult]
    took_ms: float
    mode: SearchMode


class DocumentIn(Strict):
    id: str = Field(min_length=1, max_length=512)
    text: str = Field(
        "", description="Embedded by the collection's model; optional in a collection of your own vectors"
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    vector: list[float] | None = Field(
        None,
        max_length=8192,
        description="Collections of your own vectors only (and required there): the document's one vector",
    )


class DocumentOut(BaseModel):
    id: str
    text: str
    metadata: dict[str, Any]


class DocumentPage(BaseModel):
    documents: list[DocumentOut]
    next_cursor: str | None = Field(
        description="Pass back as `cursor` for the next page; null after the last"
    )
    total: int = Field(description="Documents matching the filter, all pages together")


class UpsertResponse(BaseModel):
    upserted: int
    searchable: bool = Field(
        True,
        description="Whether search finds the documents yet: false when they are durable but applying them to "
        "the vectors, BM25 or the filter columns failed (the next write or poll applies them again)",
    )


class DeleteResponse(BaseModel):
    deleted: str


class JobAccepted(BaseModel):
    job_id: str


class JobStatus(BaseModel):
    job_id: str
    kind: str
    collection: str
    status: Literal["queued", "running", "succeeded", "failed"]
    progress: float
    done: int
    total: int
    error: str | None = None
    manifest: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    error: str
    field: str | None = None


class IndexFields(BaseModel):
    fields: list[str]
    counts: dict[str, int] = Field(description="documents, chunks and vectors in the live index")


MAX_FACET_FIELDS = 64
MAX_FACET_VALUES = 100


class FacetsRequest(Strict):
    filter: dict[str, Any] | None = Field(None, description=FILTER_DESCRIPTION, examples=FILTER_EXAMPLES)
    fields: list[str] = Field(
        min_length=1,
        max_length=MAX_FACET_FIELDS,
        description="metadata fields to describe (GET /index/fields)",
    )
    top: int = Field(10, ge=1, le=MAX_FACET_VALUES, description="most frequent values listed per field")


class FacetValue(BaseModel):
    value: bool | int | float | str
    count: int = Field(
        description="matching documents with this value (once each, however often it is listed)"
    )


class FacetSpan(BaseModel):
    min: int | float | str
    max: int | float | str


class FieldFacet(BaseModel):
    type: Literal["number", "date", "string", "boolean", "other", "mixed"] | None = Field(
        description="what the field's values are among the matches (dates: ISO strings; null: no values)"
    )
    documents: int = Field(description="matching documents with a value in this field")
    values: list[FacetValue] = Field(description="most frequent first; numbers by value, text as written")
    numbers: FacetSpan | None = Field(description="least and greatest number")
    dates: FacetSpan | None = Field(description="earliest and latest instant, each as written")


class FacetsResponse(BaseModel):
    total: int = Field(description="documents matching the filter")
    fields: dict[str, FieldFacet]
    took_ms: float
