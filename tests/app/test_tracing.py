"""Traces: the spans of one hybrid search with a filter and a rerank, recorded by the SDK's in-memory exporter
from a real app (tiny models, a real index), and the standard variables that turn export on or leave it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from app.service.tracing import _export_wanted, _resource_attributes
from app.settings import Settings
from encoder_runtime.tracing import child_span
from index.query import ranking
from tests.app.test_named_models import serve

ROOT = Path(__file__).resolve().parents[2]

DOCUMENTS = [
    {"id": f"d{i}", "text": text, "metadata": {"lang": lang}}
    for i, (text, lang) in enumerate(
        [
            ("the cat sat on the mat", "en"),
            ("a dog chased the cat around the garden", "en"),
            ("cats sleep most of the day", "en"),
            ("the stock market fell sharply today", "en"),
            ("le chat dort sur le tapis", "fr"),
            ("a kitten is a young cat", "en"),
            ("rain is expected over the weekend", "en"),
        ]
    )
]
CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # a caller's W3C trace context
SEARCH = {
    "query": "a cat on a mat",
    "mode": "hybrid",
    "top_k": 2,
    "filter": {"lang": "en"},
    "rerank": {"candidates": 5},
    "include_text": True,
}


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The SDK as ``configure_tracing`` sets it up, with the in-memory exporter in place of OTLP. The API takes
    one provider per process, so the test puts back the unset state after (other tests run with tracing off)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    saved = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE._done
    trace._TRACER_PROVIDER_SET_ONCE._done = False
    trace.set_tracer_provider(provider)
    try:
        yield memory
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE._done = saved


def test_a_hybrid_search_with_a_filter_and_a_rerank_is_one_trace_of_its_steps(
    exporter: InMemorySpanExporter, tiny_bert: Path, tiny_cross_encoder: Path, tmp_path: Path, monkeypatch
) -> None:
    # A large collection's filter: one FAISS search skipping non-matching ids (a handful of documents would be
    # scored exactly, without FAISS).
    monkeypatch.setattr(ranking, "SELECTIVE_CHUNKS", 0)
    settings = Settings(
        model=str(tiny_bert),
        fill_mask_model=str(tiny_bert),
        rerank_models=f"tiny={tiny_cross_encoder}",
        backend="torch",
        index=tmp_path / "index",
        model_load_attempts=1,
    )

    async def scenario(client: httpx.AsyncClient, app) -> None:
        assert (await client.put("/documents", json=DOCUMENTS)).status_code == 200
        exporter.clear()
        answer = await client.post("/search", json=SEARCH, headers={"traceparent": CALLER})
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["results"]) == 2

    serve(settings, scenario)
    spans = exporter.get_finished_spans()
    # FastAPI's own server span, continuing the caller's trace; the service's steps are under its endpoint's.
    root = one(spans, "POST /search")
    assert {span.context.trace_id for span in spans} == {int(CALLER.split("-")[1], 16)}
    assert root.parent.span_id == int(CALLER.split("-")[2], 16) and root.kind is SpanKind.SERVER
    assert attributes(root).items() >= {"http.route": "/search", "http.response.status_code": 200}.items()
    search = child(spans, child(spans, root, "fastapi.endpoint"), "search")
    assert attributes(search) == {
        "cloze.collection": "default",
        "cloze.search.mode": "hybrid",
        "cloze.search.k": 2,
        "cloze.search.offset": 0,
        "cloze.search.filtered": True,
        "cloze.rerank.candidates": 5,
        "cloze.results": 2,
    }
    embed = child(spans, search, "embed")
    assert attributes(embed) == {"cloze.batcher": "embed", "cloze.texts": 1}
    check_batcher(spans, embed, "embed", texts=1)

    assert attributes(child(spans, search, "pool.queue")) == {"cloze.pool": "search"}
    first_stage = child(spans, search, "index.search")
    # The first stage ranks the rerank's candidates, from the top: 5 of them, not the page's 2.
    assert (
        attributes(first_stage).items()
        >= {"cloze.search.mode": "hybrid", "cloze.search.k": 5, "cloze.results": 5}.items()
    )
    assert attributes(child(spans, first_stage, "index.filter")) == {"cloze.filter.documents": 6}
    dense = child(spans, first_stage, "index.dense")
    assert attributes(dense)["cloze.search.depth"] == 30 and attributes(dense)["cloze.candidates"] == 6
    faiss = child(spans, dense, "faiss.search")
    assert attributes(faiss)["cloze.faiss.filtered"] is True and attributes(faiss)["cloze.candidates"] >= 6
    bm25 = child(spans, first_stage, "index.bm25")
    assert attributes(bm25)["cloze.search.depth"] == 30 and 1 <= attributes(bm25)["cloze.candidates"] <= 6
    fusion = child(spans, first_stage, "index.fusion")
    assert attributes(fusion) == {
        "cloze.fusion": "rrf60",
        "cloze.fusion.dense": 6,
        "cloze.fusion.bm25": attributes(bm25)["cloze.candidates"],
        "cloze.candidates": 6,
    }
    assert attributes(child(spans, first_stage, "store.read")) == {"cloze.documents": 5}

    rerank = child(spans, search, "rerank")
    assert attributes(rerank) == {"cloze.batcher": "rerank:tiny", "cloze.candidates": 5}
    check_batcher(spans, rerank, "rerank:tiny", texts=5)
    assert attributes(child(spans, search, "store.read")) == {"cloze.documents": 2}  # the page's texts, whole
    for span in spans:  # each step within its parent's time
        parent = next((p for p in spans if span.parent and p.context.span_id == span.parent.span_id), None)
        if parent is not None:
            assert parent.start_time <= span.start_time <= span.end_time <= parent.end_time, span.name


def check_batcher(spans: list[ReadableSpan], parent: ReadableSpan, batcher: str, texts: int) -> None:
    """Tokenised, queued, then run in forward passes (of at least this request's texts), in that order."""
    tokenize, queue = child(spans, parent, "batcher.tokenize"), child(spans, parent, "batcher.queue")
    passes = [s for s in spans if s.name == "batcher.pass" and s.parent.span_id == parent.context.span_id]
    assert attributes(tokenize) == {"cloze.batcher": batcher, "cloze.texts": texts}
    assert attributes(queue) == {"cloze.batcher": batcher}
    assert passes and sum(attributes(p)["cloze.batch.size"] for p in passes) >= texts
    assert all(attributes(p)["cloze.batch.tokens"] > 0 for p in passes)
    assert tokenize.end_time == queue.start_time and queue.end_time == min(p.start_time for p in passes)


def test_spans_are_the_shared_no_op_under_no_recording_span(exporter: InMemorySpanExporter) -> None:
    """What the hot path meets with tracing off: no span object, no context change, nothing exported."""
    exporter.clear()
    tracer = trace.get_tracer(__name__)
    first, second = child_span(tracer, "a"), child_span(tracer, "b", {"k": 1})
    assert first is second
    with first as span:
        assert not span.is_recording() and trace.get_current_span() is trace.INVALID_SPAN
    assert exporter.get_finished_spans() == ()


def test_export_follows_the_standard_variables() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert not _export_wanted({})
    assert _export_wanted(endpoint)
    assert _export_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not _export_wanted(endpoint | {"OTEL_SDK_DISABLED": "true"})
    assert not _export_wanted(endpoint | {"OTEL_TRACES_EXPORTER": "none"})
    with pytest.raises(ValueError, match="OTLP over HTTP"):
        _export_wanted(endpoint | {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert _resource_attributes({}) == {"service.name": "cloze-search"}
    assert _resource_attributes({"OTEL_SERVICE_NAME": "search-eu"}) == {}


PROBE = """
import json, sys
from app.service.tracing import configure_tracing
from opentelemetry import trace
on = configure_tracing()
provider = trace.get_tracer_provider()
resource = getattr(provider, "resource", None)
print(json.dumps([on, type(provider).__name__, "opentelemetry.sdk" in sys.modules,
                  resource.attributes.get("service.name") if resource else None]))
"""


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, [False, "ProxyTracerProvider", False, None]),  # off: the SDK is not even imported
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
            [True, "TracerProvider", True, "cloze-search"],
        ),
    ],
)
def test_serve_sets_up_the_sdk_only_when_an_endpoint_is_set(environment: dict, expected: list) -> None:
    """What ``create_service`` does at start, in a process of its own (the API keeps one provider a process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | environment
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, (name, [span.name for span in spans])
    return found[0]


def child(spans: list[ReadableSpan], parent: ReadableSpan, name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.parent and s.parent.span_id == parent.context.span_id]
    assert len(found) == 1, (name, parent.name, [(s.name, s.parent and s.parent.span_id) for s in spans])
    return found[0]


def attributes(span: ReadableSpan) -> dict:
    return dict(span.attributes or {})
