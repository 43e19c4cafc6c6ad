"""``cloze serve``: uvicorn with JSON logs, graceful shutdown (in-flight requests drain), the exposure check,
and limits for slow or greedy clients: a connection cap, a keep-alive timeout and a header-read timeout."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.service.auth import check_exposure
from app.service.middleware import JsonFormatter
from app.settings import get_settings

DRAIN_SECONDS = 30
LINGER_SECONDS = 2.0  # after a refusal sent mid-request, what the client still sends is read and dropped,
LINGER_BYTES = 12 << 20  # for this long or up to this much, whichever comes first (a 10 MB URL fits)
HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: 69\r\n\r\n"
    b'{"error":"request line and headers over the size limit","field":null}'
)
log = logging.getLogger("cloze.service")


class CoalescingTransport:
    """A transport that sends what one turn of the event loop wrote as one ``write``: uvicorn writes a
    response's status line and headers, then its body, each straight to the socket, so every small answer
    cost two send() calls here and two reads in the client. Everything but ``write``, ``close`` and
    ``abort`` goes to the real transport unchanged (flow control, extra info, reading). ``linger``: asked at
    each ``close``; True when the protocol drains the connection first and closes it later itself."""

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        linger: Callable[[], bool] | None = None,
    ):
        self._transport, self._loop, self._linger = transport, loop, linger
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        if self._linger is not None and self._linger():
            return
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn (0.54) has no header-read timeout: a client that trickles header bytes (or opens a socket and
    sends nothing) held a connection for ever. Here each request's headers must all arrive within
    ``header_timeout`` of its first byte (of the connection, for the first request), or the socket closes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        coalescing = CoalescingTransport(transport, self.loop, self._linger_if_body_unread)
        super().connection_made(coalescing)  # type: ignore[arg-type]
        self._lingering = False
        settings = get_settings()  # read in each worker process
        self.header_timeout, self.max_header_bytes = settings.header_timeout_s, settings.max_header_bytes
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_bytes = 0
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def data_received(self, data: bytes) -> None:
        """httptools keeps an unfinished header in memory until it ends, so an endless one grew the process
        until the timeout: past ``max_header_bytes`` of unfinished headers the request gets 431. A chunk
        after which the headers are still unfinished was all header bytes."""
        if self._lingering:
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self.transport.close()
            return
        super().data_received(data)
        if self._header_timer is None or self.transport.is_closing():
            return
        self._header_bytes += len(data)
        if self._header_bytes > self.max_header_bytes:
            self._cancel_header_timer()
            log.info("closing a connection whose request headers passed %s bytes", self.max_header_bytes)
            self._answer_and_linger(HEADERS_TOO_LARGE)

    def _answer_and_linger(self, answer: bytes) -> None:
        """Send ``answer``, then close as ``_linger`` does."""
        self.transport.write(answer)
        self._linger()

    def _linger(self) -> None:
        """End our side and drop what the client still sends (for ``LINGER_SECONDS``, at most ``LINGER_BYTES``)
        before closing: closing with unread bytes makes the kernel reset the connection, and the reset can
        reach the client before the answer (a long URL got "connection reset" instead of its 431)."""
        self._lingering, self._lingered = True, 0
        self.transport.flush()  # type: ignore[attr-defined]  # CoalescingTransport: out before the EOF
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()  # flow control may have paused reading mid-body
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _linger_if_body_unread(self) -> bool:
        """Asked when the connection is to close: if its request's body has not all arrived (a refusal sent
        before reading it), drain it first (``_linger``) instead of closing on unread bytes."""
        cycle = self.cycle
        if self._lingering or self.transport.is_closing() or cycle is None or not cycle.more_body:
            return False
        self._linger()
        return True

    def on_response_complete(self) -> None:
        """A response sent before its request's body all arrived ends the connection: uvicorn would keep it
        open, drop the rest of the body unbounded and never close (its keep-alive timer is re-armed only by a
        next response), so a client that writes its whole body before reading waited for ever."""
        super().on_response_complete()
        # While its body is unread no later request can have been parsed: ``self.cycle`` is this response's.
        self._linger_if_body_unread()

    def _cancel_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            log.info("closing a connection whose request headers took over %ss", self.header_timeout)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if getattr(self, "_header_timer", None) is None:
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)


MALLOC_ARENAS = 2


def return_freed_memory() -> None:
    """Fix glibc's mmap threshold at 1 MiB: by default it rises after large frees (up to 32 MiB), so the
    big transient arrays of a forward pass or a long document come from the heap afterwards and stay in the
    process's RSS for good. Fixed, every block of 1 MiB or more goes back to the system when freed
    (the RSS figures in benchmarks/results/hostile_input.json are with it). And cap glibc's arenas (one per
    thread by default, up to 8 a core, whose freed pages seldom go back): with them, a soak's writer grew
    ~7 MB a minute, flat with two (RELIABILITY.md, Soak). An explicit ``MALLOC_ARENA_MAX`` wins; workers
    that ``--workers`` spawns inherit the variable."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    arenas = os.environ.setdefault("MALLOC_ARENA_MAX", str(MALLOC_ARENAS))
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
        libc.mallopt(m_mmap_threshold, 1 << 20)
        libc.mallopt(m_trim_threshold, 4 << 20)
        if arenas.isdigit() and int(arenas) > 0:
            libc.mallopt(m_arena_max, int(arenas))
    except (OSError, AttributeError):  # not glibc (musl, macOS): their allocators do as they do
        log.debug("mallopt unavailable", exc_info=True)


def configure_logging(level: str, access_log: bool = True) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = name != "uvicorn.access"  # our RequestLog writes the access line
    # No getpid() system call, thread or process-name lookup per log line (one per request with the access
    # log); the JSON lines never show them.
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
    logging.getLogger("cloze.access").setLevel(logging.NOTSET if access_log else logging.WARNING)


def check_workers(workers: int, read_only: bool) -> None:
    """One process writes an index (it holds the index's writer lock): several workers on a writable
    index would leave all but one unable to open it, so that is refused before anything starts."""
    if workers > 1 and not read_only:
        raise SystemExit(
            f"cloze serve: --workers {workers} needs a read-only index (CLOZE_INDEX_READ_ONLY=true); "
            "a writable index has exactly one writer process. Serve writes with --workers 1 (searches "
            "already run on every core), or run read-only workers beside one writer"
        )


def run_server(host: str, port: int, workers: int = 1) -> None:
    import uvicorn

    settings = get_settings()
    check_exposure(host, settings.api_keys + settings.read_api_keys, settings.allow_open)
    check_workers(workers, settings.index_read_only)
    configure_logging(settings.log_level, settings.access_log)
    return_freed_memory()
    uvicorn.run(
        "app.service.main:create_service",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,
        access_log=False,  # RequestLog writes one line per request; uvicorn's would be a second, unseen one
        timeout_graceful_shutdown=DRAIN_SECONDS,
        http=HeaderTimeoutProtocol,
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.keep_alive_s,
    )
