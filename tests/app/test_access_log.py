"""The access line: one JSON object per request on the service's log, and CLOZE_ACCESS_LOG=false to drop it."""

from __future__ import annotations

import io
import json
import logging

import pytest

from app.service.metrics import Metrics
from app.service.middleware import RequestRecorder
from app.service.server import configure_logging

UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access")
SCOPE = {"type": "http", "method": "POST", "path": "/embed", "headers": []}


@pytest.fixture
def service_log():
    """``configure_logging`` as ``cloze serve`` runs it, writing to a buffer; the test's logging restored after."""
    root, access = logging.getLogger(), logging.getLogger("cloze.access")
    saved = root.handlers[:], root.level, access.level, logging.logProcesses, logging.logThreads
    uvicorn = {
        name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate) for name in UVICORN
    }
    buffer = io.StringIO()

    def configure(access_log: bool) -> io.StringIO:
        configure_logging("info", access_log)
        root.handlers[0].setStream(buffer)
        return buffer

    yield configure
    root.handlers[:], level, access_level, logging.logProcesses, logging.logThreads = saved
    root.setLevel(level)
    access.setLevel(access_level)
    for name, (handlers, propagate) in uvicorn.items():
        logging.getLogger(name).handlers[:], logging.getLogger(name).propagate = handlers, propagate


def served(metrics: Metrics) -> float:
    return metrics.requests.labels("/embed", "POST", "200")._value.get()


def test_each_request_writes_one_json_line_with_its_id_route_status_and_time(service_log):
    buffer, metrics = service_log(access_log=True), Metrics()
    recorder = RequestRecorder(metrics)
    recorder.record(SCOPE, "/embed", 200, 0.012345, recorder.request_id(SCOPE))
    recorder.record(SCOPE, "/embed", 200, 0.5, "given-by-the-caller")
    first, second = (json.loads(line) for line in buffer.getvalue().splitlines())
    assert {
        key: first[key] for key in ("logger", "level", "msg", "method", "path", "route", "status", "ms")
    } == {
        "logger": "cloze.access",
        "level": "info",
        "msg": "request",
        "method": "POST",
        "path": "/embed",
        "route": "/embed",
        "status": 200,
        "ms": 12.35,
    }
    assert first["request_id"] and first["request_id"] != second["request_id"] == "given-by-the-caller"
    assert isinstance(first["ts"], float) and "process" not in first and "thread" not in first
    assert served(metrics) == 2


def test_access_log_off_writes_no_line_and_still_counts_the_request(service_log):
    buffer, metrics = service_log(access_log=False), Metrics()
    RequestRecorder(metrics).record(SCOPE, "/embed", 200, 0.01, "abc")
    logging.getLogger("cloze.service").warning("a warning still gets through")
    [line] = buffer.getvalue().splitlines()
    assert json.loads(line)["msg"] == "a warning still gets through"
    assert served(metrics) == 1
