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
FilterValue = str | int | float | bool | list[str | int | float | bool]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI's shape; unknown fields (``user``...) are accepted and ignored, as OpenAI clients send them."""

    input: Text | TextList
    model: str | None = None
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


class SearchRequest(Strict):
    query: str = Field(min_length=1)
    top_k: int = Field(10, ge=1)
    mode: SearchMode = "hybrid"
    filter: dict[str, FilterValue] | None = None
    include_text: bool = False


class SearchResult(BaseModel):
    id: str
    score: float
    text: str | None = None
    chunk: str
    chunk_index: int
    metadata: dict[str, Any]


class SearchResponse(BaseModel):
    results: list[SearchResult]
    took_ms: float
    mode: SearchMode


class DocumentIn(Strict):
    id: str = Field(min_length=1, max_length=512)
    text: str = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class DocumentOut(BaseModel):
    id: str
    text: str
    metadata: dict[str, Any]


class UpsertResponse(BaseModel):
    upserted: int
    searchable: bool = True


class DeleteResponse(BaseModel):
    deleted: str


class JobAccepted(BaseModel):
    job_id: str


class JobStatus(BaseModel):
    job_id: str
    kind: str
    status: Literal["queued", "running", "succeeded", "failed"]
    progress: float
    done: int
    total: int
    error: str | None = None
    manifest: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    error: str
    field: str | None = None
