"""An upsert during a rebuild waits for a few forward passes, not for the rebuild's page (issue 42: 12.5 s).

The encoder runs passes on one FIFO pool shared by the rebuild and the upserts; the passes are slowed here
(3 ms a text, so the test does not depend on how busy the cores are) to make a queued page visible."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from index.records import Document
from index.search_index import SearchIndex
from tests.index.conftest import tiny_documents


def test_an_upsert_during_a_rebuild_does_not_wait_for_the_rebuilds_page(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    index.upsert([Document(f"d{i}", r["text"]) for i, r in enumerate(tiny_documents(2000))])
    real_run, real_embed = tiny_encoder.run, tiny_encoder.embed
    embedding = threading.Event()

    def slow_run(items):
        time.sleep(0.003 * len(items))
        return real_run(items)

    def watched_embed(texts, normalize=None):
        if len(texts) > 5:  # the rebuild's, not the upsert's
            embedding.set()
        return real_embed(texts, normalize)

    monkeypatch.setattr(tiny_encoder, "run", slow_run)
    monkeypatch.setattr(tiny_encoder, "embed", watched_embed)
    rebuild = threading.Thread(target=index.rebuild)
    rebuild.start()
    try:
        assert embedding.wait(60)
        time.sleep(0.05)  # the rebuild's passes are queued
        words = "queen king paris river city capital cat dog mat".split()
        docs = [Document(f"u{n}", " ".join(words * n)[: 12 * n]) for n in (1, 3, 6, 12, 24)]
        started = time.perf_counter()
        index.upsert(docs)  # texts of different lengths: several passes, through the shared pool
        waited = time.perf_counter() - started
    finally:
        rebuild.join()
        monkeypatch.undo()
    assert waited < 1.0, waited  # a 2,000-chunk page queued ahead took 3 s here
    assert all(index.get(d.id) is not None for d in docs)
    index.close()
