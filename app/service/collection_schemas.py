"""The bodies of the collection and snapshot routes: what a collection is made of, and what an archive holds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.service.schemas import Strict


class CollectionCreate(Strict):
    """A new, empty collection (documents come by `PUT /collections/{name}/documents` or `cloze index build
    --collection`). Its build options apply to every build and rebuild of it."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "legal", "model": "legal"}, {"name": "images", "dimension": 512}]
        },
    )
    name: str = Field(description="lower-case letters, digits, `-` and `_`, at most 64")
    model: str = Field("default", description="a served embedding model's name (`GET /models`)")
    dimension: int | None = Field(
        None,
        ge=1,
        le=8192,
        description="Instead of `model`: a collection of your own vectors of this length, one per document",
    )
    metric: Literal["cosine", "dot"] | None = Field(
        None, description="With `dimension`: how vectors compare (default cosine; dot keeps their length)"
    )
    factory: str | None = Field(
        None, max_length=128, description="FAISS factory string (e.g. `HNSW32`); default: chosen by size"
    )
    chunk_window: int | None = Field(None, ge=8, description="tokens per chunk; default: the model's window")
    chunk_overlap: int | None = Field(None, ge=0, description="tokens neighbouring chunks share")


class CollectionOut(BaseModel):
    name: str
    model: str | None = Field(description="null for a collection of your own vectors")
    dimension: int | None = Field(None, description="a collection of your own vectors: their length")
    metric: str | None = Field(None, description="a collection of your own vectors: cosine or dot")
    status: str = Field(description="ready, opening or failed (then `error` says why)")
    error: str | None = None
    documents: int | None = None
    chunks: int | None = None
    version: int | None = None
    factory: str | None = None
    chunk_window: int | None = None
    chunk_overlap: int | None = None
    bytes_on_disk: int | None = None  # `GET /collections/{name}` only
    last_write: str | None = None  # `GET /collections/{name}` only
    created: str | None = None


class CollectionList(BaseModel):
    collections: list[CollectionOut]


class CollectionDeleted(BaseModel):
    deleted: str


class SnapshotInfo(BaseModel):
    """One archive: its name (for download, delete and restore) and what it holds."""

    name: str
    bytes: int
    created: str | None = None
    sequence: int | None = Field(None, description="the changelog sequence the snapshot holds writes up to")
    documents: int | None = None
    chunks: int | None = None
    vectors: int | None = None
    version: int | None = Field(None, description="the index version it was taken from")
    model_fingerprint: str | None = None
    problem: str | None = Field(None, description="set when the archive's own description does not read")


class SnapshotList(BaseModel):
    collection: str
    snapshots: list[SnapshotInfo] = Field(description="newest first")


class SnapshotDeleted(BaseModel):
    deleted: str


class RestoreResult(BaseModel):
    version: int = Field(description="the new version that now serves the collection")
    sequence: int | None = None
    documents: int | None = None
    chunks: int | None = None
