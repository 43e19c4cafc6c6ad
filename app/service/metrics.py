"""Prometheus metrics, in a registry per app (so tests can build several apps in one process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "cloze_requests_total", "HTTP requests", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "cloze_request_seconds",
            "HTTP latency",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "cloze_queue_depth", "Texts admitted and not yet answered", ["batcher"], registry=self.registry
        )
        self.batch_size = Histogram(
            "cloze_batch_size",
            "Sequences per forward pass",
            ["batcher"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.batch_tokens = Histogram(
            "cloze_batch_tokens",
            "Padded tokens per forward pass",
            ["batcher"],
            buckets=(64, 256, 1024, 2048, 4096, 8192, 16384),
            registry=self.registry,
        )
        self.index_size = Gauge("cloze_index_size", "Index size", ["unit"], registry=self.registry)
        self.index_repairs = Counter(
            "cloze_index_repairs_total",
            "Damage the index repaired by itself (lost pointer, damaged FAISS file, FAISS/SQLite disagreement)",
            ["reason"],
            registry=self.registry,
        )

    def count_repair(self, reason: str) -> None:
        self.index_repairs.labels(reason).inc()

    def batch_observer(self, batcher: str) -> Callable[[int, int], None]:
        def observe(sequences: int, tokens: int) -> None:
            self.batch_size.labels(batcher).observe(sequences)
            self.batch_tokens.labels(batcher).observe(tokens)

        return observe

    def watch_queue(self, batcher: str, depth: Callable[[], int]) -> None:
        self.queue_depth.labels(batcher).set_function(depth)
