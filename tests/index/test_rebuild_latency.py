"""An upsert during a rebuild waits for a few forward passes, not for the rebuild's page (issue 42: 12.5 s).

The encoder runs passes on one FIFO pool shared by the rebuild and the upserts; the passes are slowed here
(3 ms a text) to make a queued page visible. What is counted is how many of the rebuild's texts ran while
the upsert waited: at most a slice in flight and one queued ahead (``EMBED_SLICE``), never the page."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from index.build.builder import EMBED_SLICE
from index.records import Document
from index.search_index import SearchIndex
from tests.index.conftest import tiny_documents


def test_an_upsert_during_a_rebuild_does_not_wait_for_the_rebuilds_page(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    index.upsert([Document(f"d{i}", r["text"]) for i, r in enumerate(tiny_documents(2000))])
    real_run, real_embed = tiny_encoder.run, tiny_encoder.embed
    embedding, upserting = threading.Event(), threading.Event()
    ran_while_upserting: list[int] = []  # texts per pass that ran while the upsert waited
    upsert_texts: list[int] = []
    caller = threading.current_thread()

    def slow_run(items):
        time.sleep(0.003 * len(items))
        if upserting.is_set():
            ran_while_upserting.append(len(items))
        return real_run(items)

    def watched_embed(texts, normalize=None):
        if threading.current_thread() is caller:
            upsert_texts.append(len(texts))
        else:
            embedding.set()  # the rebuild's
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
        upserting.set()
        index.upsert(docs)  # texts of different lengths: several passes, through the shared pool
        upserting.clear()
    finally:
        rebuild.join()
        monkeypatch.undo()
    rebuild_texts = sum(ran_while_upserting) - sum(upsert_texts)
    assert rebuild_texts <= 2 * EMBED_SLICE, rebuild_texts  # a queued page was 2,000 chunks (issue 42)
    assert all(index.get(d.id) is not None for d in docs)
    index.close()
