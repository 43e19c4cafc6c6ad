"""``cloze serve``: uvicorn with JSON logs, graceful shutdown (in-flight requests drain), and the exposure check."""

from __future__ import annotations

import logging

from app.service.auth import check_exposure
from app.service.middleware import JsonFormatter
from app.settings import get_settings

DRAIN_SECONDS = 30


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = name != "uvicorn.access"  # our RequestLog writes the access line


def run_server(host: str, port: int, workers: int = 1) -> None:
    import uvicorn

    settings = get_settings()
    check_exposure(host, settings.api_keys, settings.allow_open)
    configure_logging(settings.log_level)
    uvicorn.run(
        "app.service.main:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,
        timeout_graceful_shutdown=DRAIN_SECONDS,
    )
