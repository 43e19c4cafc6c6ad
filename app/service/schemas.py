"""Request and response bodies. Limits that depend on settings are checked in the routes (``limits.py``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from encoder_runtime.fill_mask import MAX_TOP_K

Text = str
SearchMode = Literal["dense", "bm25", "hybrid"]
FilterValue = str | int | float | bool | list[str | int | float | bool]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI's shape; unknown fields (``user``...) are accepted and ignored, as OpenAI clients send them."""

    input: Text | list[Text]
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


class EmbedRequest(Strict):
    """TEI's ``/embed``."""

    inputs: Text | list[Text]
    normalize: bool = True
    truncate: bool = False


class FillMaskRequest(Strict):
    inputs: Text | list[Text]
    top_k: int = Field(5, ge=1, le=MAX_TOP_K)
    targets: list[str] | None = Field(None, min_length=1, max_length=50)


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
