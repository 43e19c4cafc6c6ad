"""One typed settings object; every field is also an environment variable ``CLOZE_<NAME>``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

Backend = Literal["auto", "torch", "onnx", "onnx-int8"]
Device = Literal["auto", "cpu", "cuda"]


class Settings(BaseSettings):
    # An empty variable (``CLOZE_MAX_BATCH_TOKENS=`` in .env.example) means the default, as if unset.
    model_config = SettingsConfigDict(
        env_prefix="CLOZE_", env_file=None, extra="ignore", env_ignore_empty=True
    )

    # Models and index
    model: str = Field(
        "", description="Embedding model: a folder or hub id; empty = bundled all-MiniLM-L6-v2"
    )
    fill_mask_model: str = Field("", description="Fill-mask model folder; empty = the shipped default")
    index: Path = Field(Path("data/index"), description="Index folder (created empty when missing)")
    index_read_only: bool = Field(
        False, description="Open the index read-only (replicas on a read-only volume); writes answer 409"
    )
    backend: Backend = Field("auto", description="auto | torch | onnx | onnx-int8")
    device: Device = Field("auto", description="auto (CUDA when usable) | cpu | cuda")
    onnx_cache: Path | None = Field(
        None, description="Where ONNX exports are cached; default: beside the model"
    )

    # Security
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Write keys, comma-separated"
    )
    read_api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Read keys, comma-separated; unset = reads are open"
    )
    allow_open: bool = Field(False, description="Allow serving without keys on a non-loopback host")
    open_operations: bool = Field(
        False, description="With read keys set, still answer /metrics and /readyz without a key"
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names besides loopback names and IP addresses that the service answers while reads "
        "need no key (a guard against DNS rebinding), comma-separated; * = any",
    )
    trusted_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Browser origins (scheme://host:port) besides the service's own that may call it",
    )

    # Batching
    max_batch_tokens: int | None = Field(
        None, ge=64, description="Token budget of one forward pass (padded); unset: the backend's (README)"
    )
    max_batch_size: int = Field(64, ge=1, description="Most sequences in one forward pass")
    max_wait_ms: float = Field(
        0.0, ge=0, description="How long a batch waits to fill (0: it fills while the previous pass runs)"
    )
    max_queue: int = Field(2048, ge=1, description="Most queued texts before answering 429")
    bulk_share: int = Field(
        4,
        ge=1,
        description="Upserts embed in the queries' batcher, on all its inference threads but one (one, when "
        "it has one); while queries wait they get at most one forward pass in this many (at least that)",
    )
    threads: int = Field(0, ge=0, description="Inference threads; 0 = all cores")

    # Request limits
    max_inputs: int = Field(256, ge=1, description="Most texts in one request")
    max_chars: int = Field(20_000, ge=1, description="Most characters in one text")
    max_body_bytes: int = Field(4_000_000, ge=1024, description="Largest request body (413 above)")
    max_body_values: int = Field(
        100_000,
        ge=100,
        description="Most JSON values (numbers, strings, lists, objects, keys) in one request body (422 above)",
    )
    max_tokenize_chars: int = Field(
        100_000,
        ge=1,
        description="Most characters in one /tokenize request, its texts together (its answer has a record "
        "per token)",
    )
    max_top_k: int = Field(100, ge=1, description="Largest top_k for /search")
    max_document_chars: int = Field(
        1_000_000, ge=1, description="Most characters in one document's text (PUT /documents)"
    )
    max_metadata_bytes: int = Field(16_384, ge=2, description="Largest metadata object, as JSON")
    max_metadata_depth: int = Field(8, ge=1, description="Deepest nesting of lists and objects in metadata")
    max_metadata_keys: int = Field(256, ge=1, description="Most keys in one metadata object, all levels")
    max_filter_values: int = Field(
        1024, ge=1, description="Most fields and values in one search filter, counted together"
    )
    max_masks: int = Field(64, ge=1, description="Most mask tokens in one fill-mask text")
    fill_mask_max_queue: int = Field(
        1024, ge=1, description="Mask tokens admitted and unanswered before fill-mask answers 429"
    )
    max_pending: int = Field(
        256, ge=1, description="Requests waiting for a search, write or storage thread before 429"
    )

    # Connections (uvicorn)
    limit_concurrency: int = Field(
        512, ge=1, description="Open connections plus requests in flight before uvicorn answers 503"
    )
    keep_alive_s: int = Field(5, ge=1, description="Idle keep-alive connections close after this")
    max_header_bytes: int = Field(
        65_536, ge=1024, description="Most bytes of a request's line and headers (431 above)"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A request whose headers have not all arrived by then is dropped"
    )

    # Health
    model_load_attempts: int = Field(
        5, ge=1, description="Tries to load the embedding model before /healthz reports the process failed"
    )
    max_jobs_kept: int = Field(100, ge=1, description="Finished jobs kept for GET /jobs/{id}")

    log_level: str = Field("info", description="Log level")
    access_log: bool = Field(True, description="One JSON line per request (logger cloze.access, at INFO)")

    @field_validator("api_keys", "read_api_keys", "allowed_hosts", "trusted_origins", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
