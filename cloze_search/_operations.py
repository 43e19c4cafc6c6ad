"""Each request the clients make, built once: (method, path, httpx keyword arguments, how to read the answer).
``Client`` sends them with httpx.Client, ``AsyncClient`` with httpx.AsyncClient; neither repeats a route."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from cloze_search import models

T = TypeVar("T")
DEFAULT = "default"  # the service's own index (CLOZE_INDEX)
DocumentLike = models.Document | Mapping[str, Any]


@dataclass
class Operation(Generic[T]):
    method: str
    path: str
    read: Callable[[Any], T]
    options: dict[str, Any] = field(default_factory=dict)  # json=, params=, content=, headers=
    # A delete's answer when a retry finds nothing: the attempt answered 429 or 503 may have committed (a 503
    # from ack=remote comes after the local commit), and what the caller asked for, its target gone, holds.
    gone: T | None = None


def under(collection: str, route: str) -> str:
    return f"/collections/{quote(collection, safe='')}{route}"


def document_json(document: DocumentLike) -> dict[str, Any]:
    return document.to_json() if isinstance(document, models.Document) else dict(document)


def batches(documents: Iterable[DocumentLike], size: int) -> Iterator[list[dict[str, Any]]]:
    if size < 1:
        raise ValueError(f"batch_size {size}: at least 1")
    stream = iter(documents)
    while batch := [document_json(d) for d in islice(stream, size)]:
        yield batch


def upsert(collection: str, batch: list[dict[str, Any]]) -> Operation[int]:
    return Operation("PUT", under(collection, "/documents"), lambda a: int(a["upserted"]), {"json": batch})


def get_document(collection: str, doc_id: str) -> Operation[models.Document]:
    return Operation("GET", under(collection, f"/documents/{quote(doc_id, safe='')}"), _document)


def delete_document(collection: str, doc_id: str) -> Operation[str]:
    path = under(collection, f"/documents/{quote(doc_id, safe='')}")
    return Operation("DELETE", path, lambda answer: answer["deleted"], gone=doc_id)


def document_page(
    collection: str, limit: int, cursor: str | None, filter: dict[str, Any] | None
) -> Operation[tuple[list[models.Document], str | None, int]]:
    params: dict[str, Any] = {"limit": limit}
    if cursor:
        params["cursor"] = cursor
    if filter is not None:
        params["filter"] = json.dumps(filter)
    return Operation("GET", under(collection, "/documents"), _page, {"params": params})


def search(
    collection: str,
    query: str | None,
    vector: Iterable[float] | None,
    top_k: int,
    offset: int,
    mode: models.Mode | None,
    filter: dict[str, Any] | None,
    include_text: bool,
    highlight: bool,
    fusion: models.Fusion | dict[str, Any] | None,
    explain: bool,
    rerank: models.Rerank | int | dict[str, Any] | None,
) -> Operation[models.SearchResults]:
    body: dict[str, Any] = {"top_k": top_k, "offset": offset, "include_text": include_text}
    optional = {
        "query": query,
        "vector": None if vector is None else [float(value) for value in vector],
        "mode": mode,  # None: hybrid, or dense for a vector alone (the service's default)
        "filter": filter,
        "fusion": fusion.to_json() if isinstance(fusion, models.Fusion) else fusion,
        "rerank": models.Rerank(rerank).to_json() if isinstance(rerank, int) else _json_of(rerank),
        "highlight": highlight or None,
        "explain": explain or None,
    }
    body |= {key: value for key, value in optional.items() if value is not None}
    return Operation("POST", under(collection, "/search"), models.SearchResults.from_json, {"json": body})


def facets(
    collection: str, fields: list[str], filter: dict[str, Any] | None, top: int
) -> Operation[dict[str, Any]]:
    body = {"fields": list(fields), "top": top} | ({"filter": filter} if filter is not None else {})
    return Operation("POST", under(collection, "/facets"), lambda answer: answer, {"json": body})


def create_collection(name: str, options: dict[str, Any]) -> Operation[models.Collection]:
    body = {"name": name} | {key: value for key, value in options.items() if value is not None}
    return Operation("POST", "/collections", _collection, {"json": body})


def list_collections() -> Operation[list[models.Collection]]:
    return Operation("GET", "/collections", lambda a: [_collection(c) for c in a["collections"]])


def get_collection(name: str) -> Operation[models.Collection]:
    return Operation("GET", f"/collections/{quote(name, safe='')}", _collection)


def delete_collection(name: str) -> Operation[str]:
    path = f"/collections/{quote(name, safe='')}"
    return Operation("DELETE", path, lambda answer: answer["deleted"], gone=name)


def rebuild(collection: str) -> Operation[str]:
    return Operation("POST", under(collection, "/index/rebuild"), lambda answer: answer["job_id"])


def job(collection: str, job_id: str) -> Operation[models.Job]:
    return Operation("GET", under(collection, f"/jobs/{quote(job_id, safe='')}"), models.Job.from_json)


def create_snapshot(collection: str) -> Operation[models.Snapshot]:
    return Operation("POST", under(collection, "/snapshots"), models.Snapshot.from_json)


def list_snapshots(collection: str) -> Operation[list[models.Snapshot]]:
    return Operation(
        "GET",
        under(collection, "/snapshots"),
        lambda a: [models.Snapshot.from_json(s) for s in a["snapshots"]],
    )


def snapshot_path(collection: str, name: str) -> str:
    return under(collection, f"/snapshots/{quote(name, safe='')}")


def delete_snapshot(collection: str, name: str) -> Operation[str]:
    return Operation("DELETE", snapshot_path(collection, name), lambda answer: answer["deleted"], gone=name)


def restore_snapshot(collection: str, name: str) -> Operation[models.Restored]:
    path = snapshot_path(collection, name) + "/restore"
    return Operation("POST", path, models.Restored.from_json)


def restore_upload(collection: str, content: Any, size: int | None) -> Operation[models.Restored]:
    """``content``: the archive's bytes as an iterable; ``size`` declared, so the service checks its free
    space before it reads a byte (None, from a pipe: sent chunked, counted as it arrives)."""
    headers = {"content-type": "application/octet-stream"}
    if size is not None:
        headers["content-length"] = str(size)
    options = {"content": content, "headers": headers}
    return Operation("POST", under(collection, "/restore"), models.Restored.from_json, options)


def embed(
    texts: str | list[str], model: str | None, normalize: bool, truncate: bool, dimensions: int | None
) -> Operation[list[list[float]]]:
    body: dict[str, Any] = {"inputs": texts, "normalize": normalize, "truncate": truncate}
    if dimensions is not None:
        body["dimensions"] = dimensions
    return Operation("POST", _model_route(model, "/embed"), lambda answer: answer, {"json": body})


def fill_mask(
    texts: str | list[str], top_k: int, targets: list[str] | None, model: str | None
) -> Operation[list[list[list[models.Prediction]]]]:
    parameters: dict[str, Any] = {"top_k": top_k} | ({"targets": targets} if targets else {})
    body = {"inputs": [texts] if isinstance(texts, str) else texts, "parameters": parameters, "nested": True}
    return Operation("POST", _model_route(model, "/fill-mask"), _predictions, {"json": body})


def rerank(
    query: str, texts: list[str], model: str | None, raw_scores: bool, return_text: bool, truncate: bool
) -> Operation[list[models.RerankResult]]:
    body = {"query": query, "texts": texts, "raw_scores": raw_scores, "return_text": return_text}
    body["truncate"] = truncate
    return Operation(
        "POST",
        _model_route(model, "/rerank"),
        lambda a: [models.RerankResult.from_json(r) for r in a],
        {"json": body},
    )


def served_models() -> Operation[dict[str, Any]]:
    return Operation("GET", "/models", lambda answer: answer)


def _model_route(model: str | None, route: str) -> str:
    return route if model is None else f"/models/{quote(model, safe='')}{route}"


def _json_of(value: Any) -> Any:
    return value.to_json() if hasattr(value, "to_json") else value


def _document(answer: dict[str, Any]) -> models.Document:
    return models.Document.from_json(answer)


def _collection(answer: dict[str, Any]) -> models.Collection:
    return models.Collection.from_json(answer)


def _page(answer: dict[str, Any]) -> tuple[list[models.Document], str | None, int]:
    return [_document(d) for d in answer["documents"]], answer["next_cursor"], answer["total"]


def _predictions(answer: list) -> list[list[list[models.Prediction]]]:
    return [[[models.Prediction.from_json(p) for p in mask] for mask in text] for text in answer]
