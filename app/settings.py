"""One typed settings object; every field is also an environment variable ``CLOZE_<NAME>``.

``python -m app.settings > docs/configuration.md`` writes the reference page from this file
(``settings_reference``); ``tests/test_docs.py`` checks that the page is current.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from index.records import DocumentLimits, collection_name_problem

Backend = Literal["auto", "torch", "onnx", "onnx-int8"]
Device = Literal["auto", "cpu", "cuda"]
DEFAULT_MODEL = "default"  # the name of the model CLOZE_MODEL (or nothing) configures: the index's model
BUNDLED = "<bundled>"  # in a model list: the bundled embedding model, or the shipped fill-mask model
MAX_NAME_LENGTH = 64
# ASCII letters, digits and . _ - only: no path separators, no control or look-alike (non-ASCII) characters.
MODEL_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


class Settings(BaseSettings):
    # An empty variable (``CLOZE_MAX_BATCH_TOKENS=`` in .env.example) means the default, as if unset.
    model_config = SettingsConfigDict(
        env_prefix="CLOZE_", env_file=None, extra="ignore", env_ignore_empty=True
    )

    # Models and index
    model: str = Field(
        "",
        description="Embedding model: a folder, or a hub id (fetched by huggingface_hub, which honours "
        "`HF_HUB_OFFLINE`); empty = the bundled all-MiniLM-L6-v2",
    )
    fill_mask_model: str = Field(
        "",
        description="Fill-mask model: any BERT-style masked-LM folder; empty = the shipped default (the "
        "bundled MiniLM plus this project's MLM delta)",
    )
    models: str = Field(
        "",
        description="More embedding models, each by name: `name=source` pairs, comma-separated "
        "(`default=<bundled>,legal=/models/legal`), or the path of a `.toml` file with a `[models]` table of "
        '`name = "source"`; a source is a folder, a hub id or `<bundled>`. `default` is the index\'s model '
        "(`CLOZE_MODEL` unless listed here; not both). Names: ASCII letters, digits, `.`, `_`, `-`, at most 64. "
        "Set, `/v1/embeddings` needs a `model` it serves (404 otherwise); unset, it serves `default` whatever "
        '`model` says (docs/api.md, "Named models")',
    )
    fill_mask_models: str = Field(
        "",
        description="More fill-mask models, as `CLOZE_MODELS` names embedding models (`<bundled>`: the shipped "
        "default); `default` is `CLOZE_FILL_MASK_MODEL` unless listed here",
    )
    rerank_models: str = Field(
        "",
        description="Rerankers (cross-encoder folders, as `CrossEncoder.save` and `cloze train reranker` write "
        "them), as `CLOZE_MODELS` names embedding models: `name=folder` pairs or a `.toml` file. A request "
        "without `model` gets `default` when listed, else the first. Unset: `/rerank` and search's `rerank` "
        "answer 404 and 422",
    )
    max_models: int = Field(
        4,
        ge=1,
        description="Most models loaded, embedding, fill-mask and rerank together, the defaults included (each "
        'holds its weights, runtime and batcher in memory: docs/benchmarks.md, "Memory per model")',
    )
    index: Path = Field(
        Path("data/index"), description="Index folder; created empty when missing, and upserts fill it"
    )
    collections_dir: Path | None = Field(
        None,
        description="Data root of the collections besides `default` (each a folder `<name>` with its index); "
        "unset: `collections` beside the index folder (`data/collections` for `data/index`). The index folder "
        "(`CLOZE_INDEX`) is the collection `default`",
    )
    max_collections: int = Field(
        100,
        ge=0,
        description="Most collections besides `default`; `POST /collections` answers 409 past it (an empty "
        'collection holds an open SQLite store and FAISS index: docs/benchmarks.md, "Memory per collection")',
    )
    delete_wait_s: float = Field(
        30.0,
        ge=0,
        description="How long `DELETE /collections/{name}` waits for the requests running on the collection "
        "(writes and restores included); past it the delete answers 409 and the collection stays",
    )
    index_read_only: bool = Field(
        False,
        description="Open the index read-only (replicas, a read-only volume): it follows the writer's "
        "published versions and writes; write endpoints answer 409",
    )
    backend: Backend = Field(
        "auto",
        description="`auto`: on a CPU ONNX Runtime int8 for embeddings and torch for fill-mask, on a GPU torch "
        "fp16; `onnx` is ONNX Runtime fp32. int8's activation scales are fixed at export by calibration on prose the package ships, so a "
        "text's vector does not depend on what shares its pass (cosine to fp32 0.990-0.994, "
        "docs/design-decisions.md)",
    )
    device: Device = Field(
        "auto", description="`auto`: CUDA when usable; `cuda` falls back to the CPU with a warning"
    )
    onnx_cache: Path | None = Field(
        None,
        description="Where ONNX exports are cached; unset: `<model>/onnx/` when the model folder is writable, "
        "else `~/.cache/cloze-search/onnx/<fingerprint>`",
    )

    # Security
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Write keys: a write key may call every route. Once any key is set, "
        "every write needs a write key and every read a key",
    )
    read_api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Read keys: a read key may read, and gets 403 on a write. Once any key of any kind is "
        "set every read needs a key too; with no key at all reads are open. With read keys and no write keys "
        "every write is refused",
    )
    collection_api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Keys scoped to collections, comma-separated `key=read:a|b` or `key=write:a` (write "
        "includes read): such a key reaches only the collections it names (403 elsewhere; `GET /collections` "
        "lists only them) and the model routes; creating or deleting a collection needs an unscoped write key, "
        "`/metrics` an unscoped key",
    )
    allow_open: bool = Field(
        False,
        description="Serve without keys on a non-loopback host (otherwise `cloze serve` refuses to start there)",
    )
    open_operations: bool = Field(
        False,
        description="With keys set, still answer `/metrics` without a key, and show all of `/readyz` to "
        "anyone (without it, a caller with no key gets `/readyz`'s `status` and `ready` only)",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="While reads need no key, the `Host` names answered besides loopback names and IP "
        "addresses (a guard against DNS rebinding; 403 `Host` otherwise); `*` = any",
    )
    trusted_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Browser origins (`scheme://host:port`) besides the service's own that "
        "may call it; any other `Origin` gets 403",
    )

    # Batching
    max_batch_tokens: int | None = Field(
        None,
        ge=64,
        description="Padded tokens in one forward pass. Unset, the backend's: on a CPU 512 for ONNX and 1,024 "
        "for torch (a longer pass runs slower per token and holds more memory: "
        "docs/design-decisions.md); on CUDA 8,192 (not measured on a GPU)",
    )
    max_batch_size: int | None = Field(
        None,
        ge=1,
        description="Most sequences in one forward pass. Unset, the backend's: 64 on a CPU, 1,024 on CUDA "
        "(a GPU pass costs about its kernel launches whatever it holds)",
    )
    max_wait_ms: float = Field(
        0.0,
        ge=0,
        description="How long a batch waits to fill; 0: a batch forms from what queued while the previous "
        "pass ran",
    )
    max_queue: int = Field(
        2048, ge=1, description="Texts admitted and unanswered before embedding requests answer 429"
    )
    bulk_share: int = Field(
        4,
        ge=1,
        description="Upserts embed in the queries' batcher, on all its inference threads but one (one, when "
        "it has one); while queries wait they get at most one forward pass in this many (at least that)",
    )
    threads: int = Field(0, ge=0, description="Inference threads; 0 = all cores")

    # Request limits
    max_inputs: int = Field(256, ge=1, description="Most texts (or documents) in one request")
    max_chars: int = Field(20_000, ge=1, description="Most characters in one text")
    max_body_bytes: int = Field(4_000_000, ge=1024, description="Largest request body, in bytes (413 above)")
    max_body_values: int = Field(
        100_000,
        ge=100,
        description="Most JSON values (numbers, strings, lists, objects, keys) in one body, counted before any "
        "other parsing (422 `body` above)",
    )
    max_tokenize_chars: int = Field(
        100_000,
        ge=1,
        description="Most characters in one `/tokenize` request, its texts together (its answer has a record "
        "per token)",
    )
    max_top_k: int = Field(100, ge=1, description="Largest `top_k` for `/search`")
    max_page_bytes: int = Field(
        8 * 2**20,
        ge=1024,
        description="Texts and metadata in one page of `GET /documents`: a page of long documents holds fewer "
        "than `limit` (always at least one; follow `next_cursor`)",
    )
    max_document_chars: int = Field(
        DocumentLimits.max_document_chars,
        ge=1,
        description="Most characters in one document's text (`PUT /documents` and a restore's import; 422 above)",
    )
    max_metadata_bytes: int = Field(
        DocumentLimits.max_metadata_bytes,
        ge=2,
        description="Largest metadata object of one document, as JSON",
    )
    max_metadata_depth: int = Field(
        DocumentLimits.max_metadata_depth,
        ge=1,
        description="Deepest nesting of lists and objects in metadata",
    )
    max_metadata_keys: int = Field(
        DocumentLimits.max_metadata_keys,
        ge=1,
        description="Most keys in one document's metadata, all levels together",
    )
    max_filter_values: int = Field(
        1024,
        ge=1,
        description="Most fields and values in one search filter, counted together (422 `filter` above)",
    )
    strict_filter_fields: bool = Field(
        False,
        description="Refuse (422) a filter naming a metadata field no document of the collection ever had; "
        "by default such a field is absent, as in MongoDB: it matches nothing and its negation everything",
    )
    max_masks: int = Field(64, ge=1, description="Most mask tokens in one fill-mask text")
    max_rerank_candidates: int = Field(
        200,
        ge=1,
        le=1000,  # the deepest a search ranks (offset + top_k)
        description="Most candidates `/search` may rerank (`rerank.candidates`); `/rerank` takes at most "
        "`CLOZE_MAX_INPUTS` documents of `CLOZE_MAX_CHARS` characters each",
    )
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
    keep_alive_s: int = Field(5, ge=1, description="Seconds before an idle keep-alive connection closes")
    max_header_bytes: int = Field(
        65_536,
        ge=1024,
        description="Most bytes of a request's line and headers (431 above, and the socket closes)",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="Seconds for a request's headers to arrive before the socket closes"
    )

    # Health and jobs
    model_load_attempts: int = Field(
        5,
        ge=1,
        description="Tries (with backoff) to load the models; after the last, `/healthz` answers 503 `failed`",
    )
    max_jobs_kept: int = Field(100, ge=1, description="Finished jobs remembered for `GET /jobs/{id}`")

    # Snapshots (backup and restore)
    snapshots_dir: Path | None = Field(
        None,
        description="Where snapshot archives of the index are written; unset: `<index>.snapshots` beside the "
        "index folder (outside it, so garbage collection, rebuilds and deleting the index never touch its "
        "backups). In Docker, point it at a volume",
    )
    snapshot_keep: int = Field(
        3, ge=1, description="Snapshots kept per collection; after each new one the oldest beyond this go"
    )
    snapshot_compression: Literal["none", "gzip"] = Field(
        "none",
        description="`gzip` (level 1): smaller archives, slower snapshots (float vectors compress little)",
    )
    max_snapshot_upload_bytes: int = Field(
        8 * 2**30,
        ge=1024,
        description="Largest archive a restore by upload accepts (413 above); streamed to disk, never held "
        "in memory",
    )

    # Replication across hosts (an S3-compatible bucket)
    replication_role: Literal["off", "writer", "replica"] = Field(
        "off",
        description="`writer`: ship every collection to the bucket (bases and the changelog's tail) and list "
        "them there (`collections.json`); `replica`: create, copy and follow each collection listed, drop "
        "those no longer listed (writes, creates and deletes answer 409). Credentials: the usual "
        "`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` variables or the host's role",
    )
    replication_bucket: str | None = Field(
        None, description="`s3://bucket[/prefix]`: where the collections' objects live, one writer per prefix"
    )
    replication_endpoint: str | None = Field(
        None, description="The S3 API's address for MinIO, Garage, SeaweedFS and the like; unset: AWS"
    )
    replication_region: str | None = Field(None, description="The bucket's region, when the store needs one")
    replication_epoch: int = Field(
        1,
        ge=1,
        description="The writer's epoch: a promoted writer takes a higher one, and a writer whose epoch is "
        "below the bucket's stops shipping (the failover runbook)",
    )
    replication_ack: Literal["local", "remote"] = Field(
        "local",
        description="When a write is acknowledged: `local` once committed on the writer's disk (the tail "
        "ships within about a second); `remote` once it is durable in the bucket too (503 when the bucket "
        "does not take it in time). A request's `ack` parameter overrides it",
    )
    replication_ack_timeout_s: float = Field(
        5.0, gt=0, description="How long a remote-mode write waits for the bucket before answering 503"
    )
    replication_poll_s: float = Field(
        0.5, gt=0, description="Seconds between a replica's looks at the bucket (and the writer's shipping)"
    )
    replication_stale_after_s: float = Field(
        10.0,
        gt=0,
        description="A replica behind the writer by more than this (the newest writer heartbeat whose "
        "position it holds is older) says `stale` on `/readyz` (and keeps serving: still 200)",
    )
    replication_watchdog_s: float = Field(
        120.0,
        gt=0,
        description="A shipper or follower thread (one per collection) silent this long is replaced by a "
        "new one",
    )
    replication_base_every: int = Field(
        20_000,
        ge=1,
        description="Changelog entries after which the writer ships a new base, so a fresh replica replays "
        "a short tail",
    )
    replication_gc_after_s: float = Field(
        3600.0,
        ge=0,
        description="The writer deletes a base, and the tail segments before it, once a newer base has been "
        "current this long (longer than any replica takes to copy a base); older versions' and epochs' "
        "objects likewise, and the folder of a collection it stopped listing (deleted, or made again) once "
        "unlisted this long. 0: never delete (leave it to a bucket lifecycle rule)",
    )

    # Logging
    log_level: str = Field(
        "info", description="Level of the JSON logs (one line per event, with its request id)"
    )
    access_log: bool = Field(True, description="One JSON line per request (logger `cloze.access`, at INFO)")

    @field_validator(
        "api_keys", "read_api_keys", "collection_api_keys", "allowed_hosts", "trusted_origins", mode="before"
    )
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @model_validator(mode="after")
    def _models_are_valid_and_bounded(self) -> Settings:
        """Refuse a bad model list at startup, naming the setting, rather than on the first request."""
        self.scoped_keys()  # a malformed scoped key stops the start, naming the setting
        count = (
            len(self.embedding_model_sources())
            + len(self.fill_mask_model_sources())
            + len(self.rerank_model_sources())
        )
        if count > self.max_models:
            raise ValueError(
                f"CLOZE_MODELS, CLOZE_FILL_MASK_MODELS and CLOZE_RERANK_MODELS: {count} models in all (the "
                "defaults included), "
                f"over CLOZE_MAX_MODELS={self.max_models}"
            )
        return self

    @model_validator(mode="after")
    def _replication_is_complete(self) -> Settings:
        if self.replication_role != "off" and not self.replication_bucket:
            raise ValueError(f"CLOZE_REPLICATION_ROLE={self.replication_role} needs CLOZE_REPLICATION_BUCKET")
        if self.replication_role != "off" and self.index_read_only:
            raise ValueError(
                "CLOZE_REPLICATION_ROLE needs a writable index folder of its own: unset CLOZE_INDEX_READ_ONLY "
                "(a replica answers writes with 409 anyway)"
            )
        return self

    def scoped_keys(self) -> list[ScopedKey]:
        return [parse_scoped_key(entry) for entry in self.collection_api_keys]

    def document_limits(self) -> DocumentLimits:
        """What an upsert (and a restore's import of an archive) lets one document hold."""
        return DocumentLimits(
            self.max_document_chars, self.max_metadata_bytes, self.max_metadata_depth, self.max_metadata_keys
        )

    @property
    def collections_root(self) -> Path:
        return self.collections_dir or Path(self.index).parent / "collections"

    @property
    def named_models(self) -> bool:
        """Whether the operator named the embedding models: then a request must name one it serves."""
        return bool(self.models.strip())

    def embedding_model_sources(self) -> dict[str, str]:
        """Name -> source (a folder or hub id; "" = the bundled model), ``default`` first."""
        listed = parse_model_list(self.models, "CLOZE_MODELS")
        return with_default(listed, self.model, "CLOZE_MODEL", "CLOZE_MODELS")

    def fill_mask_model_sources(self) -> dict[str, str]:
        """Name -> source ("" = the shipped fill-mask model), ``default`` first."""
        listed = parse_model_list(self.fill_mask_models, "CLOZE_FILL_MASK_MODELS")
        return with_default(listed, self.fill_mask_model, "CLOZE_FILL_MASK_MODEL", "CLOZE_FILL_MASK_MODELS")

    def rerank_model_sources(self) -> dict[str, str]:
        """Name -> folder of each reranker, as listed (no bundled reranker: none unless configured)."""
        listed = parse_model_list(self.rerank_models, "CLOZE_RERANK_MODELS")
        if bundled := [name for name, source in listed.items() if not source]:
            raise ValueError(
                f"CLOZE_RERANK_MODELS: {bundled[0]!r} needs a cross-encoder folder (none is bundled)"
            )
        return listed


@dataclass(frozen=True)
class ScopedKey:
    key: str
    access: Literal["read", "write"]
    collections: frozenset[str]


def parse_scoped_key(entry: str) -> ScopedKey:
    """``key=read:a|b`` -> ScopedKey(key, "read", {"a", "b"}); a ValueError names what is wrong."""
    key, _, grant = entry.rpartition("=")
    access, _, names = grant.partition(":")
    collections = frozenset(name.strip() for name in names.split("|") if name.strip())
    if not key or access not in ("read", "write") or not collections:
        raise ValueError(
            "CLOZE_COLLECTION_API_KEYS: an entry is not `key=read:a|b` or `key=write:a` (the key itself is "
            "not repeated here)"
        )
    for name in collections:
        if problem := collection_name_problem(name):
            raise ValueError(f"CLOZE_COLLECTION_API_KEYS: {name!r} is not a collection name: {problem}")
    return ScopedKey(key, access, collections)  # type: ignore[arg-type]


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model (it travels in URL paths, logs and metric labels), or None."""
    if not name:
        return "empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"{len(name)} characters, over {MAX_NAME_LENGTH}"
    if not MODEL_NAME.fullmatch(name) or ".." in name:
        return "use ASCII letters, digits, '.', '_' and '-' (starting and ending with a letter or digit, no '..')"
    return None


def parse_model_list(value: str, setting: str) -> dict[str, str]:
    """``name=source,...`` (or a ``.toml`` file's ``[models]`` table) -> {name: source}; "" = the bundled one."""
    value = value.strip()
    if not value:
        return {}
    pairs = _toml_models(Path(value), setting) if value.endswith(".toml") else _pairs(value, setting)
    models: dict[str, str] = {}
    for name, source in pairs:
        if problem := model_name_problem(name):
            raise ValueError(f"{setting}: model name {name!r}: {problem}")
        if name.casefold() in (known.casefold() for known in models):  # Legal and legal: one name twice
            raise ValueError(f"{setting}: model name {name!r} given twice")
        models[name] = "" if source.strip() in ("", BUNDLED) else source.strip()
    return models


def _pairs(value: str, setting: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, equals, source = item.partition("=")
        if not equals:
            raise ValueError(f"{setting}: {item!r} is not name=source (e.g. legal=/models/legal)")
        pairs.append((name.strip(), source))
    return pairs


def _toml_models(path: Path, setting: str) -> list[tuple[str, str]]:
    import tomllib  # Python 3.11+ (the images run 3.11 and 3.12); only this form of the setting needs it

    try:
        table = tomllib.loads(path.read_text()).get("models")
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{setting}: cannot read {path}: {exc}") from exc
    if not isinstance(table, dict) or not all(isinstance(source, str) for source in table.values()):
        raise ValueError(f'{setting}: {path} needs a [models] table of name = "source" lines')
    return list(table.items())


def with_default(listed: dict[str, str], fallback: str, single: str, many: str) -> dict[str, str]:
    """The list with ``default`` first: as listed, else the single-model setting's (one place, never two)."""
    if DEFAULT_MODEL in listed:
        if fallback:
            raise ValueError(f"{single} and {many} both set the default model: set it in one of them")
        return {DEFAULT_MODEL: listed[DEFAULT_MODEL], **listed}
    return {DEFAULT_MODEL: fallback, **listed}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


# Variables read outside the settings object, by the CLI, the index and the crash tests.
OTHER_VARIABLES = """\
## Variables outside the settings object

Read where they are used, not by the service's settings: `CLOZE_CACHE_DIR` (default
`~/.cache/cloze-search`: the assembled fill-mask model, `cloze eval beir`'s indexes), `CLOZE_DATA_DIR`
(named evaluation sets, default `../shared/data`), `CLOZE_INDEX_SNAPSHOT_EVERY` (changes between FAISS
snapshots, default 10000), and the crash tests' pause hooks `CLOZE_INDEX_PAUSE_AT`, `CLOZE_INDEX_PAUSE_FILE`,
`CLOZE_INDEX_PAUSE_SECONDS` and `CLOZE_INDEX_PAUSE_ARMED_BY` (`index/faultpoints.py`; never set them in
production). `HOST` and `PORT` set `cloze serve`'s address (as `--host` and `--port` do), and
`HF_HUB_OFFLINE=1` keeps a hub id in `CLOZE_MODEL` from reaching the network. `CLOZE_API_KEY` is the key
`cloze index snapshot|restore --url` send (as `--api-key` does).
"""


def _sections() -> dict[str, str]:
    """Field name -> the section comment above it in ``Settings`` (a comment line after a blank line)."""
    lines = inspect.getsource(Settings).splitlines()
    sections: dict[str, str] = {}
    current = ""
    for before, line in zip(["x", *lines], lines, strict=False):
        comment = re.fullmatch(r" {4}# (.+)", line)
        if comment and not before.strip():
            current = comment.group(1)
        field = re.match(r" {4}(\w+):", line)
        if field and field.group(1) in Settings.model_fields:
            sections[field.group(1)] = current
    return sections


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is None or value in ("", []):
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _allowed(info: FieldInfo) -> str:
    annotation = info.annotation
    if get_origin(annotation) is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(annotation))
    if annotation is bool:
        return "`true`, `false`"
    bounds = [
        f"{symbol} {getattr(meta, attr)}"
        for meta in info.metadata
        for attr, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="))
        if getattr(meta, attr, None) is not None
    ]
    if bounds:
        return ", ".join(bounds)
    if annotation == list[str]:
        return "comma-separated"
    return ""


def settings_reference() -> str:
    """docs/configuration.md: every field of ``Settings`` as ``CLOZE_<NAME>``, grouped by its section."""
    out = [
        "# Configuration",
        "",
        "Every setting is an environment variable (also read from `.env` by docker compose). An empty "
        "variable means the default. Generated from `app/settings.py` by "
        "`python -m app.settings > docs/configuration.md`; `tests/test_docs.py` fails when this page is stale.",
    ]
    sections = _sections()
    current = None
    for name, info in Settings.model_fields.items():
        section = sections.get(name) or "Other"
        if section != current:
            current = section
            out += [
                "",
                f"## {section}",
                "",
                "| variable | default | allowed | meaning |",
                "|---|---|---|---|",
            ]
        description = (info.description or "").replace("|", "\\|")
        out.append(f"| `CLOZE_{name.upper()}` | {_default(info)} | {_allowed(info)} | {description}. |")
    out += ["", OTHER_VARIABLES]
    return "\n".join(out)


if __name__ == "__main__":
    print(settings_reference(), end="")
