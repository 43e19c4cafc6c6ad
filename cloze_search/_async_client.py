# Generated from cloze_search/client.py by `python -m tools.generate_client`: do not edit.
"""The asyncio client, ``AsyncClient``: ``Client`` (client.py) with every request awaited. Public as
``cloze_search.AsyncClient`` and ``cloze_search.client.AsyncClient``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from cloze_search import _operations as ops
from cloze_search._http import (
    DOWNLOAD_BLOCK,
    AsyncUploadBody,
    ClientSettings,
    DownloadFile,
    checked,
    download_target,
    replayable,
    unreachable,
)
from cloze_search._operations import DEFAULT, DocumentLike, Operation
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


class AsyncClient(ClientSettings):
    """The asyncio twin of ``Client``, generated from it: the same methods and docstrings, awaited;
    ``list_documents`` is an async iterator. Use it with ``async with`` or ``await client.close()``."""

    def __init__(self, url: str = "http://127.0.0.1:8000", **settings: Any):
        super().__init__(url, **settings)
        self._http = httpx.AsyncClient(**self.http_options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pooled connections (a context manager's exit does it)."""
        await self._http.aclose()

    async def _send(self, method: str, path: str, **options: Any) -> tuple[httpx.Response, int]:
        """The last answer to one request and the retries before it: a 429 or 503 is retried while
        ``max_retries`` last, if the body can be sent again whole (``replayable``)."""
        attempt, again = (0, replayable(options.get("content")))
        while True:
            try:
                response = await self._http.request(method, path, **options)
            except httpx.TransportError as exc:
                raise unreachable(self.url, exc) from exc
            delay = self.delay(response, attempt) if again else None
            if delay is None:
                return (response, attempt)
            await asyncio.sleep(delay)
            attempt += 1

    async def _call(self, operation: Operation[T]) -> T:
        """An operation of ``_operations`` sent, and its answer read into the client's types; an error
        answer raised. A delete retried that then finds nothing is done (``Operation.gone``)."""
        response, retries = await self._send(operation.method, operation.path, **operation.options)
        if retries and response.status_code == 404 and (operation.gone is not None):
            return operation.gone
        return operation.read(checked(response, self.url).json())

    async def create_collection(
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
        return await self._call(ops.create_collection(name, options))

    async def list_collections(self) -> list[Collection]:
        """Every collection the service holds, each with its model, status and counts."""
        return await self._call(ops.list_collections())

    async def get_collection(self, name: str) -> Collection:
        """One collection, with what only a single read reports (``bytes_on_disk``, ``last_write``)."""
        return await self._call(ops.get_collection(name))

    async def delete_collection(self, name: str) -> str:
        """Delete a collection once the requests running on it finish (``Conflict`` if they outlast the wait);
        the name deleted. ``default``, the service's own index, is never deleted."""
        return await self._call(ops.delete_collection(name))

    async def upsert(
        self, documents: Iterable[DocumentLike], *, collection: str = DEFAULT, batch_size: int | None = None
    ) -> int:
        """Insert or replace, ``batch_size`` documents a request (each batch committed when it returns); the
        number upserted."""
        total = 0
        for batch in ops.batches(documents, batch_size or self.batch_size):
            total += await self._call(ops.upsert(collection, batch))
        return total

    async def get_document(self, doc_id: str, *, collection: str = DEFAULT) -> Document:
        """A stored document by id (``NotFound`` when there is none)."""
        return await self._call(ops.get_document(collection, doc_id))

    async def delete_document(self, doc_id: str, *, collection: str = DEFAULT) -> str:
        """Delete a document and its chunks; the id deleted. Retried after a 429 or 503 and then not found, it
        is done: that answer may have come after the delete committed (``ack=remote``)."""
        return await self._call(ops.delete_document(collection, doc_id))

    async def list_documents(
        self, *, collection: str = DEFAULT, filter: dict[str, Any] | None = None, page_size: int = 100
    ) -> AsyncIterator[Document]:
        """Every matching document, by id, fetched a page at a time as the iterator is read."""
        cursor: str | None = None
        while True:
            page, cursor, _ = await self._call(ops.document_page(collection, page_size, cursor, filter))
            for item in page:
                yield item
            if cursor is None:
                return

    async def count_documents(
        self, *, collection: str = DEFAULT, filter: dict[str, Any] | None = None
    ) -> int:
        """How many documents match ``filter`` (all of them without one), without reading them."""
        return (await self._call(ops.document_page(collection, 1, None, filter)))[2]

    async def search(
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
        return await self._call(
            ops.search(
                collection,
                query,
                vector,
                top_k,
                offset,
                mode,
                filter,
                include_text,
                highlight,
                fusion,
                explain,
                rerank,
            )
        )

    async def facets(
        self,
        fields: list[str],
        *,
        collection: str = DEFAULT,
        filter: dict[str, Any] | None = None,
        top: int = 10,
    ) -> dict[str, Any]:
        """Over the documents matching ``filter``: their ``total`` and, per field, its type, its ``top`` most
        frequent values with document counts, and its least and greatest number and date."""
        return await self._call(ops.facets(collection, fields, filter, top))

    async def rebuild(self, *, collection: str = DEFAULT) -> str:
        """Start a re-embedding of every document; the job's id (``job``)."""
        return await self._call(ops.rebuild(collection))

    async def job(self, job_id: str, *, collection: str = DEFAULT) -> Job:
        """A rebuild's status and progress; poll it until ``status`` is ``succeeded`` or ``failed``."""
        return await self._call(ops.job(collection, job_id))

    async def create_snapshot(self, *, collection: str = DEFAULT) -> Snapshot:
        """A backup archive of the collection as it is now, kept by the service (writes go on meanwhile)."""
        return await self._call(ops.create_snapshot(collection))

    async def list_snapshots(self, *, collection: str = DEFAULT) -> list[Snapshot]:
        """The archives the service keeps for the collection, newest first."""
        return await self._call(ops.list_snapshots(collection))

    async def delete_snapshot(self, name: str, *, collection: str = DEFAULT) -> str:
        """Delete an archive the service keeps; the name deleted."""
        return await self._call(ops.delete_snapshot(collection, name))

    async def restore_snapshot(self, name: str, *, collection: str = DEFAULT) -> Restored:
        """Roll the collection back to a snapshot the service keeps."""
        return await self._call(ops.restore_snapshot(collection, name))

    async def upload_snapshot(
        self, archive: str | os.PathLike[str], *, collection: str = DEFAULT
    ) -> Restored:
        """Replace the collection with an archive file (streamed, not read into memory; a 429 or 503 sends it
        again from its start, except from a pipe, which cannot be read twice)."""
        with open(archive, "rb") as handle:
            body = AsyncUploadBody(handle)
            return await self._call(ops.restore_upload(collection, body, body.size))

    async def download_snapshot(
        self, name: str, target: str | os.PathLike[str], *, collection: str = DEFAULT, progress: bool = True
    ) -> Path:
        """Save an archive to ``target`` (a folder or a file name), with a progress bar; written under a
        temporary name and renamed, so a broken download never looks whole."""
        path = download_target(target, name)
        async with self._http.stream("GET", ops.snapshot_path(collection, name)) as response:
            if response.status_code >= 400:
                await response.aread()
                checked(response, self.url)
            with DownloadFile(path, response, progress) as out:
                async for block in response.aiter_bytes(DOWNLOAD_BLOCK):
                    out.write(block)
        return path

    async def embed(
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
        return await self._call(ops.embed(texts, model, normalize, truncate, dimensions))

    async def fill_mask(
        self,
        texts: str | list[str],
        *,
        top_k: int = 5,
        targets: list[str] | None = None,
        model: str | None = None,
    ) -> list[list[list[Prediction]]]:
        """Predictions per text, per mask token, best first."""
        return await self._call(ops.fill_mask(texts, top_k, targets, model))

    async def rerank(
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
        return await self._call(ops.rerank(query, texts, model, raw_scores, return_text, truncate))

    async def models(self) -> dict[str, Any]:
        """The models the service serves (embedding, fill-mask, rerank) and its defaults, as ``GET /models``
        answers."""
        return await self._call(ops.served_models())


__all__ = ["AsyncClient"]
