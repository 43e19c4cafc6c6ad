"""``Client`` (blocking) and ``AsyncClient`` (asyncio) for a cloze-search service, on httpx.

Both send the same requests (``_operations``); they differ only in how they wait. A 429 or 503 answer is
retried after its ``Retry-After`` (else a doubling delay), at most ``max_retries`` times, then raised as
``Overloaded``; every other error is raised at once as a ``ClozeError`` carrying the service's message and
field."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from cloze_search import _operations as ops
from cloze_search._operations import DEFAULT, DocumentLike, Operation
from cloze_search.errors import ClozeError, ConnectionFailed, error_for
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
RETRIED = (429, 503)
DOWNLOAD_BLOCK = 1 << 20


class _Settings:
    """What both clients share: where the service is, the key, timeouts and the retry policy."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = 60.0,
        max_retries: int = 5,
        batch_size: int = 64,
        http_options: dict[str, Any] | None = None,
    ):
        """``http_options`` go to the httpx client as they are (``verify``, ``proxy``, ``transport``...)."""
        self.url = url.rstrip("/")
        self.http_options = {"base_url": self.url, "timeout": timeout} | (http_options or {})
        self.http_options["headers"] = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_retries, self.batch_size = max_retries, batch_size

    def delay(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before trying again, or None to answer now."""
        if response.status_code not in RETRIED or attempt >= self.max_retries:
            return None
        asked = _retry_after(response)
        return min(0.5 * 2**attempt, 30.0) if asked is None else asked


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None


def _checked(response: httpx.Response) -> httpx.Response:
    """The response, or the service's error as an exception (its message and field)."""
    if response.status_code < 400:
        return response
    try:
        body = response.json()
        message, field = str(body.get("error") or body), body.get("field")
    except (ValueError, AttributeError):
        message, field = response.text[:500] or response.reason_phrase, None
    raise error_for(response.status_code, message, field, _retry_after(response))


def _unreachable(url: str, exc: httpx.TransportError) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach {url}: {type(exc).__name__}: {exc}")


class Client(_Settings):
    """A blocking client. ``Client(url, api_key=..., timeout=60)``; use as a context manager or ``close()``."""

    def __init__(self, url: str = "http://127.0.0.1:8000", **settings: Any):
        super().__init__(url, **settings)
        self._http = httpx.Client(**self.http_options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, **options)
            except httpx.TransportError as exc:
                raise _unreachable(self.url, exc) from exc
            delay = self.delay(response, attempt)
            if delay is None:
                return _checked(response)
            time.sleep(delay)
            attempt += 1

    def _call(self, operation: Operation[T]) -> T:
        response = self._send(operation.method, operation.path, **operation.options)
        return operation.read(response.json())

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
        return self._call(ops.list_collections())

    def get_collection(self, name: str) -> Collection:
        return self._call(ops.get_collection(name))

    def delete_collection(self, name: str) -> str:
        return self._call(ops.delete_collection(name))

    # ---- documents ----
    def upsert(
        self, documents: Iterable[DocumentLike], *, collection: str = DEFAULT, batch_size: int | None = None
    ) -> int:
        """Insert or replace, ``batch_size`` documents a request (each batch committed when it returns)."""
        batches = ops.batches(documents, batch_size or self.batch_size)
        return sum(self._call(ops.upsert(collection, batch)) for batch in batches)

    def get_document(self, doc_id: str, *, collection: str = DEFAULT) -> Document:
        return self._call(ops.get_document(collection, doc_id))

    def delete_document(self, doc_id: str, *, collection: str = DEFAULT) -> str:
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
        return self._call(ops.job(collection, job_id))

    def create_snapshot(self, *, collection: str = DEFAULT) -> Snapshot:
        return self._call(ops.create_snapshot(collection))

    def list_snapshots(self, *, collection: str = DEFAULT) -> list[Snapshot]:
        return self._call(ops.list_snapshots(collection))

    def delete_snapshot(self, name: str, *, collection: str = DEFAULT) -> str:
        return self._call(ops.delete_snapshot(collection, name))

    def restore_snapshot(self, name: str, *, collection: str = DEFAULT) -> Restored:
        """Roll the collection back to a snapshot the service keeps."""
        return self._call(ops.restore_snapshot(collection, name))

    def upload_snapshot(self, archive: str | os.PathLike[str], *, collection: str = DEFAULT) -> Restored:
        """Replace the collection with an archive file (streamed, not read into memory)."""
        with open(archive, "rb") as body:
            return self._call(ops.restore_upload(collection, body))

    def download_snapshot(
        self, name: str, target: str | os.PathLike[str], *, collection: str = DEFAULT, progress: bool = True
    ) -> Path:
        """Save an archive to ``target`` (a folder or a file name), with a progress bar; written under a
        temporary name and renamed, so a broken download never looks whole."""
        path = _download_target(target, name)
        with self._http.stream("GET", ops.snapshot_path(collection, name)) as response:
            if response.status_code >= 400:
                response.read()
                _checked(response)
            with _DownloadFile(path, response, progress) as out:
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
        return self._call(ops.rerank(query, texts, model, raw_scores, return_text, truncate))

    def models(self) -> dict[str, Any]:
        return self._call(ops.served_models())


class AsyncClient(_Settings):
    """The asyncio twin of ``Client``: the same methods, awaited; ``list_documents`` is an async iterator."""

    def __init__(self, url: str = "http://127.0.0.1:8000", **settings: Any):
        super().__init__(url, **settings)
        self._http = httpx.AsyncClient(**self.http_options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = await self._http.request(method, path, **options)
            except httpx.TransportError as exc:
                raise _unreachable(self.url, exc) from exc
            delay = self.delay(response, attempt)
            if delay is None:
                return _checked(response)
            await asyncio.sleep(delay)
            attempt += 1

    async def _call(self, operation: Operation[T]) -> T:
        response = await self._send(operation.method, operation.path, **operation.options)
        return operation.read(response.json())

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
        options = dict(model=model, dimension=dimension, metric=metric, factory=factory)
        options |= dict(chunk_window=chunk_window, chunk_overlap=chunk_overlap)
        return await self._call(ops.create_collection(name, options))

    async def list_collections(self) -> list[Collection]:
        return await self._call(ops.list_collections())

    async def get_collection(self, name: str) -> Collection:
        return await self._call(ops.get_collection(name))

    async def delete_collection(self, name: str) -> str:
        return await self._call(ops.delete_collection(name))

    async def upsert(
        self, documents: Iterable[DocumentLike], *, collection: str = DEFAULT, batch_size: int | None = None
    ) -> int:
        total = 0
        for batch in ops.batches(documents, batch_size or self.batch_size):
            total += await self._call(ops.upsert(collection, batch))
        return total

    async def get_document(self, doc_id: str, *, collection: str = DEFAULT) -> Document:
        return await self._call(ops.get_document(collection, doc_id))

    async def delete_document(self, doc_id: str, *, collection: str = DEFAULT) -> str:
        return await self._call(ops.delete_document(collection, doc_id))

    async def list_documents(
        self, *, collection: str = DEFAULT, filter: dict[str, Any] | None = None, page_size: int = 100
    ) -> AsyncIterator[Document]:
        cursor: str | None = None
        while True:
            page, cursor, _ = await self._call(ops.document_page(collection, page_size, cursor, filter))
            for document in page:
                yield document
            if cursor is None:
                return

    async def count_documents(
        self, *, collection: str = DEFAULT, filter: dict[str, Any] | None = None
    ) -> int:
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
        return await self._call(
            ops.search(
                collection, query, vector, top_k, offset, mode, filter,
                include_text, highlight, fusion, explain, rerank,
            )
        )  # fmt: skip

    async def facets(
        self,
        fields: list[str],
        *,
        collection: str = DEFAULT,
        filter: dict[str, Any] | None = None,
        top: int = 10,
    ) -> dict[str, Any]:
        return await self._call(ops.facets(collection, fields, filter, top))

    async def rebuild(self, *, collection: str = DEFAULT) -> str:
        return await self._call(ops.rebuild(collection))

    async def job(self, job_id: str, *, collection: str = DEFAULT) -> Job:
        return await self._call(ops.job(collection, job_id))

    async def create_snapshot(self, *, collection: str = DEFAULT) -> Snapshot:
        return await self._call(ops.create_snapshot(collection))

    async def list_snapshots(self, *, collection: str = DEFAULT) -> list[Snapshot]:
        return await self._call(ops.list_snapshots(collection))

    async def delete_snapshot(self, name: str, *, collection: str = DEFAULT) -> str:
        return await self._call(ops.delete_snapshot(collection, name))

    async def restore_snapshot(self, name: str, *, collection: str = DEFAULT) -> Restored:
        return await self._call(ops.restore_snapshot(collection, name))

    async def download_snapshot(
        self, name: str, target: str | os.PathLike[str], *, collection: str = DEFAULT, progress: bool = True
    ) -> Path:
        path = _download_target(target, name)
        async with self._http.stream("GET", ops.snapshot_path(collection, name)) as response:
            if response.status_code >= 400:
                await response.aread()
                _checked(response)
            with _DownloadFile(path, response, progress) as out:
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
        return await self._call(ops.embed(texts, model, normalize, truncate, dimensions))

    async def fill_mask(
        self,
        texts: str | list[str],
        *,
        top_k: int = 5,
        targets: list[str] | None = None,
        model: str | None = None,
    ) -> list[list[list[Prediction]]]:
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
        return await self._call(ops.rerank(query, texts, model, raw_scores, return_text, truncate))

    async def models(self) -> dict[str, Any]:
        return await self._call(ops.served_models())


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


def _download_target(target: str | os.PathLike[str], name: str) -> Path:
    path = Path(target)
    return path / name if path.is_dir() else path


class _DownloadFile:
    """``path`` written under a temporary name with a byte progress bar, renamed into place when whole."""

    def __init__(self, path: Path, response: httpx.Response, progress: bool):
        from tqdm import tqdm

        self.path, self.partial = path, path.with_name(f".{path.name}.partial")
        total = int(response.headers.get("content-length") or 0) or None
        self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=path.name, disable=not progress)
        self.handle = open(self.partial, "wb")  # noqa: SIM115 (closed in __exit__)

    def __enter__(self) -> _DownloadFile:
        return self

    def write(self, block: bytes) -> None:
        self.handle.write(block)
        self.bar.update(len(block))

    def __exit__(self, kind: object, *rest: object) -> None:
        self.bar.close()
        self.handle.close()
        if kind is None:
            os.replace(self.partial, self.path)
        else:
            self.partial.unlink(missing_ok=True)


__all__ = ["AsyncClient", "Client", "ClozeError"]
