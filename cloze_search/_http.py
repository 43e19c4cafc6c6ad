"""What ``Client`` and ``AsyncClient`` share beside the requests themselves (``_operations``): their settings
and retry policy, how an error answer becomes an exception, and the bodies of downloads and uploads."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from cloze_search.errors import ConnectionFailed, error_for

RETRIED = (429, 503)
DOWNLOAD_BLOCK = 1 << 20
UPLOAD_BLOCK = 1 << 20


class ClientSettings:
    """What both clients hold: where the service is, the key, timeouts and the retry policy."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = 60.0,
        max_retries: int = 5,
        batch_size: int = 64,
        http_options: dict[str, Any] | None = None,
    ):
        """``http_options`` go to the httpx client as they are (``verify``, ``proxy``, ``transport``...). ``url``
        is the service's root (``http://host:port``); one with no ``http://`` or ``https://`` is a ValueError
        saying so, at once rather than at the first request."""
        self.url = service_url(url)
        self.http_options = {"base_url": self.url, "timeout": timeout} | (http_options or {})
        self.http_options["headers"] = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_retries, self.batch_size = max_retries, batch_size

    def delay(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before trying again, or None to answer now."""
        if response.status_code not in RETRIED or attempt >= self.max_retries:
            return None
        asked = retry_after(response)
        return min(0.5 * 2**attempt, 30.0) if asked is None else asked


def service_url(url: str) -> str:
    """``url`` without its trailing slash, or a ValueError that says what to write instead."""
    url = url.strip().rstrip("/")
    scheme, separator, rest = url.partition("://")
    if not url:
        raise ValueError("the service's URL is empty: give its root, as http://127.0.0.1:8000")
    if not separator:
        raise ValueError(
            f"the service's URL {url!r} has no scheme: add http:// (http://{url}), or https:// where it "
            "answers over TLS"
        )
    if scheme.lower() not in ("http", "https") or not rest:
        raise ValueError(
            f"the service's URL {url!r}: the client speaks http:// or https://, as http://{rest or 'host:port'}"
        )
    return url


def retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None


def checked(response: httpx.Response, root: str | None = None) -> httpx.Response:
    """The response, or the service's error as an exception (its message and field). A 404 that names nothing
    (no route answers the path; the service's own 404s say which collection, document or snapshot is missing)
    says that ``root``, the client's URL, is probably not the service's root."""
    if response.status_code < 400:
        return response
    try:
        body = response.json()
        message, field = str(body.get("error") or body), body.get("field")
        routed = message != "Not Found"  # Starlette's answer for a path no route matches
    except (ValueError, AttributeError):
        message, field = response.text[:500] or response.reason_phrase, None
        routed = False  # not the service's JSON: another server, or a proxy's page
    if response.status_code == 404 and not routed and root is not None:
        message = no_route(root, response.request)
    raise error_for(response.status_code, message, field, retry_after(response))


def no_route(root: str, request: httpx.Request) -> str:
    """What a 404 for a path no route answers most likely means: a URL that is not the service's root."""
    asked = f"{request.method} {request.url} found no route"
    url = httpx.URL(root)
    if url.path.strip("/"):
        bare = str(url.copy_with(path="/", query=None, fragment=None)).rstrip("/")
        return (
            f"{asked}: the client's URL {root} has a path ({url.path}), so it is probably not the service's "
            f"root; give the URL its routes start at (/search, /collections, /v1/embeddings), as {bare}"
        )
    return f"{asked}: is {root} a cloze-search service, and one as new as this client?"


def unreachable(url: str, exc: httpx.TransportError) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach {url}: {type(exc).__name__}: {exc}")


def replayable(content: object) -> bool:
    """Whether a request's body can be sent again on a retry: none, bytes, or an upload that can seek back
    (a generator, once read, would send nothing under its declared length)."""
    return content is None or isinstance(content, bytes | str) or getattr(content, "replayable", False)


class _FileBody:
    """A file's bytes from where it stood when given; each reading starts there again, so a retry sends them
    whole. A file that cannot seek back (a pipe) can be read once: not ``replayable``, never retried."""

    def __init__(self, handle: BinaryIO):
        self.handle = handle
        self.start = handle.tell() if handle.seekable() else None
        self.replayable = self.start is not None

    def rewind(self) -> None:
        if self.start is not None:
            self.handle.seek(self.start)

    @property
    def size(self) -> int | None:
        """The bytes to send, for Content-Length; None (sent chunked) when unknown."""
        if self.start is None:
            return None
        return os.fstat(self.handle.fileno()).st_size - self.start


class UploadBody(_FileBody):
    """A file's bytes a block at a time: an upload never holds the whole archive in memory."""

    def __iter__(self) -> Iterator[bytes]:
        self.rewind()
        while block := self.handle.read(UPLOAD_BLOCK):
            yield block


class AsyncUploadBody(_FileBody):
    """``UploadBody`` for httpx.AsyncClient, which refuses a blocking stream; each read in a worker thread,
    so the event loop never waits on the disk."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.rewind()
        while block := await asyncio.to_thread(self.handle.read, UPLOAD_BLOCK):
            yield block


def download_target(target: str | os.PathLike[str], name: str) -> Path:
    path = Path(target)
    return path / name if path.is_dir() else path


class ByteProgress:
    """Bytes so far, of how many, and the rate, one line on stderr rewritten at most every ``every`` seconds.
    Written here rather than taken from tqdm: the client installs with httpx alone."""

    def __init__(self, name: str, total: int | None, enabled: bool, every: float = 0.2):
        self.name, self.total, self.enabled, self.every = name, total, enabled, every
        self.done = 0
        self.started = self.shown = time.monotonic()

    def update(self, count: int) -> None:
        self.done += count
        if self.enabled and time.monotonic() - self.shown >= self.every:
            self.shown = time.monotonic()
            sys.stderr.write("\r" + self.line())

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + self.line() + "\n")

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-3)
        of = f" of {readable_bytes(self.total)}" if self.total else ""
        return f"{self.name}: {readable_bytes(self.done)}{of}, {readable_bytes(self.done / elapsed)}/s"


def readable_bytes(count: float) -> str:
    unit = "B"
    for bigger in ("kB", "MB", "GB"):
        if count < 1000:
            break
        count, unit = count / 1000, bigger
    return f"{count:.0f} B" if unit == "B" else f"{count:.1f} {unit}"


class DownloadFile:
    """``path`` written under a temporary name with a byte progress line, renamed into place when whole."""

    def __init__(self, path: Path, response: httpx.Response, progress: bool):
        self.path, self.partial = path, path.with_name(f".{path.name}.partial")
        total = int(response.headers.get("content-length") or 0) or None
        self.bar = ByteProgress(path.name, total, enabled=progress)
        self.handle = open(self.partial, "wb")  # noqa: SIM115 (closed in __exit__)

    def __enter__(self) -> DownloadFile:
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
