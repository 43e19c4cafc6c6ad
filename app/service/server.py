"""``cloze serve``: uvicorn with JSON logs, graceful shutdown (in-flight requests drain), and the exposure check."""

from __future__ import annotations

import logging

from app.service.auth import check_exposure
from app.service.middleware import JsonFormatter
from app.settings import get_settings

DRAIN_SECONDS = 30


def configure_logging(level: str, access_log: bool = True) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = name != "uvicorn.access"  # our RequestLog writes the access line
    logging.logProcesses = False  # no getpid() system call per log line (one per request with the access log)
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
    check_exposure(host, settings.api_keys, settings.allow_open)
    check_workers(workers, settings.index_read_only)
    configure_logging(settings.log_level, settings.access_log)
    uvicorn.run(
        "app.service.main:create_service",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,
        access_log=False,  # RequestLog writes one line per request; uvicorn's would be a second, unseen one
        timeout_graceful_shutdown=DRAIN_SECONDS,
    )
