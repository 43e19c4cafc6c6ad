"""``Client`` (blocking) and ``AsyncClient`` (asyncio) for a cloze-search service, on httpx.

Both send the same requests (``_operations``); they differ only in how they wait. ``Client`` is written
here; ``AsyncClient`` is generated from it (``_async_client.py``, by ``python -m tools.generate_client``),
so the two keep the same methods, signatures and docstrings. A 429 or 503 answer is retried after its
``Retry-After`` (else a doubling delay), at most ``max_retries`` times, then raised as ``Overloaded``;
every other error is raised at once as a ``ClozeError`` carrying the service's message and field."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from cloze_search import _operations as ops
from cloze_search._async_client import AsyncClient
from cloze_search._http import (
    DOWNLOAD_BLOCK,
    ClientSettings,
    DownloadFile,
    UploadBody,
    checked,
    download_target,
    replayable,
    unreachable,
)
from cloze_search._operations import DEFAULT, DocumentLike, Operation
from cloze_search.errors import ClozeError
from cloze_search.models import (
    Collection,
    Document,
    Fusion,
    Job,
    Mode,
    Prediction,
    Rerank,
    RerankResult,
    Restored,
    SearchResults,
    Snapshot,
)

T = TypeVar("T")


class Client(ClientSettings):
    """A blocking client. ``Client(url, api_key=..., timeout=60)``; use as a context manager or ``close()``."""

    def __init__(self, url: str = "http://127.0.0.1:8000", **settings: Any):
        super().__init__(url, **settings)
        self._http = httpx.Client(**self.http_options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the pooled connections (a context manager's exit does it)."""
        self._http.close()

    def _send(self, method: str, path: str, **options: Any) -> tuple[httpx.Response, int]:
        """The last answer to one request and the retries before it: a 429 or 503 is retried while
        ``max_retries`` last, if the body can be sent again whole (``replayable``)."""
        attempt, again = 0, replayable(options.get("content"))
        while True:
            try:
                response = self._http.request(method, path, **options)
            except httpx.TransportError as exc:
                raise unreachable(self.url, exc) from exc
            delay = self.delay(response, attempt) if again else None
            if delay is None:
                return response, attempt
            time.sleep(delay)
            attempt += 1

    def _call(self, operation: Operation[T]) -> T:
        """An operation of ``_operations`` sent, and its answer read into the client's types; an error
        answer raised. A delete retried that then finds nothing is done (``Operation.gone``)."""
        response, retries = self._send(operation.method, operation.path, **operation.options)
        if retries and response.status_code == 404 and operation.gone is not None:
            return operation.gone
        return operation.read(checked(response, self.url).json())

    # ---- collections ----
    def create_collection(
        self,
        name: str,
        *,
        model: str | None = None,
        dimension: int | None = None,
        metric: str | None = None,
        factory: str | None = None,
        chunk_window: int | None = None,
        chunk_overlap: int | None = None,
    ) -> Collection:
        """On a served model (``model``, default ``default``), or of your own vectors (``dimension``)."""
        options = dict(model=model, dimension=dimension, metric=metric, factory=factory)
        options |= dict(chunk_window=chunk_window, chunk_overlap=chunk_overlap)
        return self._call(ops.create_collection(name, options))

    def list_collections(self) -> list[Collection]:
        """Every collection the service holds, each with its model, status and counts."""
        return self._call(ops.list_collections())

    def get_collection(self, name: str) -> Collection:
        """One collection, with what only a single read reports (``bytes_on_disk``, ``last_write``)."""
        return self._call(ops.get_collection(name))

    def delete_collection(self, name: str) -> str:
        """Delete a collection once the requests running on it finish (``Conflict`` if they outlast the wait);
        the name deleted. ``default``, the service's own index, is never deleted."""
        return self._call(ops.delete_collection(name))

    # ---- documents ----
    def upsert(
        self, documents: Iterable[DocumentLike], *, collection: str = DEFAULT, batch_size: int | None = None
    ) -> int:
        """Insert or replace, ``batch_size`` documents a request (each batch committed when it returns); the
        number upserted."""
        total = 0
        for batch in ops.batches(documents, batch_size or self.batch_size):
            total += self._call(ops.upsert(collection, batch))
        return total

    def get_document(self, doc_id: str, *, collection: str = DEFAULT) -> Document:
        """A stored document by id (``NotFound`` when there is none)."""
        return self._call(ops.get_document(collection, doc_id))

    def delete_document(self, doc_id: str, *, collection: str = DEFAULT) -> str:
        """Delete a document and its chunks; the id deleted. Retried after a 429 or 503 and then not found, it
        is done: that answer may have come after the delete committed (``ack=remote``)."""
        return self._call(ops.delete_document(collection, doc_id))

    def list_documents(
        self, *, collection: str = DEFAULT, filter: dict[str, Any] | None = None, page_size: int = 100
    ) -> Iterator[Document]:
        """Every matching document, by id, fetched a page at a time as the iterator is read."""
        cursor: str | None = None
        while True:
            page, cursor, _ = self._call(ops.document_page(collection, page_size, cursor, filter))
            yield from page
            if cursor is None:
                return

    def count_documents(self, *, collection: str = DEFAULT, filter: dict[str, Any] | None = None) -> int:
        """How many documents match ``filter`` (all of them without one), without reading them."""
        return self._call(ops.document_page(collection, 1, None, filter))[2]

    # ---- search ----
    def search(
        self,
        query: str | None = None,
        *,
        collection: str = DEFAULT,
        vector: Iterable[float] | None = None,
        top_k: int = 10,
        offset: int = 0,
        mode: Mode | None = None,
        filter: dict[str, Any] | None = None,
        include_text: bool = False,
        highlight: bool = False,
        fusion: Fusion | dict[str, Any] | None = None,
        explain: bool = False,
        rerank: Rerank | int | dict[str, Any] | None = None,
    ) -> SearchResults:
        """Dense, BM25 or hybrid (the default; dense for a ``vector`` alone). ``rerank``: a cross-encoder
        re-scores that many first-stage candidates (or a ``Rerank``)."""
        return self._call(
            ops.search(
                collection, query, vector, top_k, offset, mode, filter,
                include_text, highlight, fusion, explain, rerank,
            )
        )  # fmt: skip

    def facets(
        self,
        fields: list[str],
        *,
        collection: str = DEFAULT,
        filter: dict[str, Any] | None = None,
        top: int = 10,
    ) -> dict[str, Any]:
        """Over the documents matching ``filter``: their ``total`` and, per field, its type, its ``top`` most
        frequent values with document counts, and its least and greatest number and date."""
        return self._call(ops.facets(collection, fields, filter, top))

    # ---- index jobs and snapshots ----
    def rebuild(self, *, collection: str = DEFAULT) -> str:
        """Start a re-embedding of every document; the job's id (``job``)."""
        return self._call(ops.rebuild(collection))

    def job(self, job_id: str, *, collection: str = DEFAULT) -> Job:
        """A rebuild's status and progress; poll it until ``status`` is ``succeeded`` or ``failed``."""
        return self._call(ops.job(collection, job_id))

    def create_snapshot(self, *, collection: str = DEFAULT) -> Snapshot:
        """A backup archive of the collection as it is now, kept by the service (writes go on meanwhile)."""
        return self._call(ops.create_snapshot(collection))

    def list_snapshots(self, *, collection: str = DEFAULT) -> list[Snapshot]:
        """The archives the service keeps for the collection, newest first."""
        return self._call(ops.list_snapshots(collection))

    def delete_snapshot(self, name: str, *, collection: str = DEFAULT) -> str:
        """Delete an archive the service keeps; the name deleted."""
        return self._call(ops.delete_snapshot(collection, name))

    def restore_snapshot(self, name: str, *, collection: str = DEFAULT) -> Restored:
        """Roll the collection back to a snapshot the service keeps."""
        return self._call(ops.restore_snapshot(collection, name))

    def upload_snapshot(self, archive: str | os.PathLike[str], *, collection: str = DEFAULT) -> Restored:
        """Replace the collection with an archive file (streamed, not read into memory; a 429 or 503 sends it
        again from its start, except from a pipe, which cannot be read twice)."""
        with open(archive, "rb") as handle:
            body = UploadBody(handle)
            return self._call(ops.restore_upload(collection, body, body.size))

    def download_snapshot(
        self, name: str, target: str | os.PathLike[str], *, collection: str = DEFAULT, progress: bool = True
    ) -> Path:
        """Save an archive to ``target`` (a folder or a file name), with a progress bar; written under a
        temporary name and renamed, so a broken download never looks whole."""
        path = download_target(target, name)
        with self._http.stream("GET", ops.snapshot_path(collection, name)) as response:
            if response.status_code >= 400:
                response.read()
                checked(response, self.url)
            with DownloadFile(path, response, progress) as out:
                for block in response.iter_bytes(DOWNLOAD_BLOCK):
                    out.write(block)
        return path

    # ---- inference ----
    def embed(
        self,
        texts: str | list[str],
        *,
        model: str | None = None,
        normalize: bool = True,
        truncate: bool = False,
        dimensions: int | None = None,
    ) -> list[list[float]]:
        """One vector per text, by the served model ``model`` (``default`` without one); a single text gets
        a list of one. ``dimensions`` keeps the first N (Matryoshka), normalised after the cut if
        ``normalize``."""
        return self._call(ops.embed(texts, model, normalize, truncate, dimensions))

    def fill_mask(
        self,
        texts: str | list[str],
        *,
        top_k: int = 5,
        targets: list[str] | None = None,
        model: str | None = None,
    ) -> list[list[list[Prediction]]]:
        """Predictions per text, per mask token, best first."""
        return self._call(ops.fill_mask(texts, top_k, targets, model))

    def rerank(
        self,
        query: str,
        texts: list[str],
        *,
        model: str | None = None,
        raw_scores: bool = False,
        return_text: bool = False,
        truncate: bool = False,
    ) -> list[RerankResult]:
        """``texts`` scored against ``query`` by a served cross-encoder, best first; ``index`` is each text's
        place in ``texts``."""
        return self._call(ops.rerank(query, texts, model, raw_scores, return_text, truncate))

    def models(self) -> dict[str, Any]:
        """The models the service serves (embedding, fill-mask, rerank) and its defaults, as ``GET /models``
        answers."""
        return self._call(ops.served_models())


class PerLoop:
    """An ``AsyncClient`` for the running event loop, made at first use in each: httpx's connections belong
    to the loop that opened them, and callers such as LangChain or LlamaIndex may run several loops."""

    def __init__(self, url: str, **settings: Any):
        self.url, self.settings = url, settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: AsyncClient | None = None

    def get(self) -> AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = AsyncClient(self.url, **self.settings), loop
        return self._client


__all__ = ["AsyncClient", "Client", "ClozeError"]
