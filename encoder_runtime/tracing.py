"""Spans for the request path, through the OpenTelemetry API only (never its SDK, never the service).

Every layer (the runtime, the index, the service) opens its spans here, and a span is opened only under a
span that records: the service's HTTP span when the service set up tracing (``app.service.tracing``). When it
did not, nothing records, and each call below costs one context-variable read and returns a shared no-op
context: no span object, no context attach. So the hot path pays next to nothing with tracing off
(benchmarks/results/tracing_cost.json), and the index and the runtime need not know whether it is on.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

Attributes = Mapping[str, AttributeValue]
# Reusable and re-entrant: a nullcontext keeps no state between uses. Its span ignores every call.
_OFF: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)


def recording() -> bool:
    """Whether the current context has a span that records: the test each helper below makes first."""
    return trace.get_current_span().is_recording()


def child_span(
    tracer: trace.Tracer, name: str, attributes: Attributes | None = None
) -> AbstractContextManager[Span]:
    """A span under the current one, made current for the block, when that one records; else the no-op. Set
    what is known only after the work with ``span.set_attribute``: on the no-op span it does nothing."""
    if not trace.get_current_span().is_recording():
        return _OFF
    return tracer.start_as_current_span(name, attributes=attributes)


def past_span(
    tracer: trace.Tracer, name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None
) -> None:
    """A finished span under the current one from times measured elsewhere: a wait in a queue, or a forward
    pass another thread ran for several requests at once. Recorded by the waiting request, on its own task,
    so no context crosses into the thread that did the work."""
    if trace.get_current_span().is_recording():
        span = tracer.start_span(name, attributes=attributes, start_time=start_ns)
        span.end(end_time=end_ns)


def in_context(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` to run in a worker thread under the caller's current span: an executor does not carry context
    variables across by itself, so spans opened in the thread would start new traces. Unchanged when nothing
    records (copying the context costs little, but nothing would read it)."""
    if not trace.get_current_span().is_recording():
        return call
    return functools.partial(contextvars.copy_context().run, call)
