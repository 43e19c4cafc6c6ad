"""OpenTelemetry traces of the service: set up from the standard ``OTEL_*`` variables, or not at all.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set: the SDK's tracer
provider, batching spans to an OTLP/HTTP exporter that reads its own variables (headers, timeout,
compression); the SDK reads the sampler (``OTEL_TRACES_SAMPLER``) and the batch queue (``OTEL_BSP_*``).
FastAPI (0.165) then opens each request's server span itself (W3C ``traceparent`` continued, ``http.route``,
status) and the spans of its dependencies, endpoint and serialisation; the service's own steps are under
them (``encoder_runtime.tracing``). Off otherwise: the SDK is not even imported, FastAPI sees the API's
placeholder provider and opens no span, so nothing records and every span below is the API's shared no-op.
docs/deployment.md, "Traces".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

log = logging.getLogger("cloze.service")
SERVICE_NAME = "cloze-search"
HTTP_PROTOCOL = "http/protobuf"  # the exporter this package depends on; the SDK's default for Python


def configure_tracing(environ: Mapping[str, str] = os.environ) -> bool:
    """Set up the SDK when the environment asks for OTLP export; whether tracing is on. Once per process
    (the API keeps the first provider it is given): ``cloze serve`` calls it in each worker as it starts."""
    if tracing_enabled():
        return True  # a provider set up already (by an embedding program, or an earlier call)
    if not _export_wanted(environ):
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create(_resource_attributes(environ)))
    # A background thread sends batches; a collector that is down loses spans, never delays a request.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing: exporting spans over OTLP/HTTP to %s", _endpoint(environ))
    return True


def tracing_enabled() -> bool:
    """Whether a real tracer provider is set: the API's own placeholder and its no-op provider are not."""
    return not isinstance(trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider))


def _endpoint(environ: Mapping[str, str]) -> str:
    return environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")


def _export_wanted(environ: Mapping[str, str]) -> bool:
    """An endpoint is set, the SDK is not disabled and the traces exporter is OTLP (the standard defaults);
    ValueError for OTLP over gRPC, which this package does not ship: said at start-up, not lost in silence."""
    if not _endpoint(environ) or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", HTTP_PROTOCOL
    )
    if protocol.strip() != HTTP_PROTOCOL:
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: this service exports OTLP over HTTP ({HTTP_PROTOCOL}); "
            "point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318 by default)"
        )
    return True


def _resource_attributes(environ: Mapping[str, str]) -> dict[str, str]:
    """``service.name`` is ``cloze-search`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names
    it (the SDK reads both; attributes given here would win over them)."""
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return {} if named else {"service.name": SERVICE_NAME}
