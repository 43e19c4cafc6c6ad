"""A rebuild is cancelled through its progress callback (the service does so at shutdown, issue 42: SIGTERM
waited 14 s for a rebuild and published it on the way down)."""

from __future__ import annotations

from pathlib import Path

import pytest

from index.build.builder import EMBED_SLICE
from index.records import Document
from index.search_index import SearchIndex
from index.storage import layout
from tests.index.conftest import tiny_documents


def test_a_rebuild_whose_progress_raises_stops_within_a_slice_and_publishes_nothing(
    tmp_path: Path, tiny_encoder
) -> None:
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert([Document(f"d{i}", r["text"]) for i, r in enumerate(tiny_documents(300))])
    versions, reports = layout.all_versions(root), []

    def cancel_once_embedding(done: int, total: int) -> None:
        reports.append((done, total))
        if done:
            raise InterruptedError("shutting down")

    with pytest.raises(InterruptedError):
        index.rebuild(cancel_once_embedding)
    assert reports[-1] == (EMBED_SLICE, 300)  # stopped after the first slice, not a 2,048-chunk page
    assert layout.all_versions(root) == versions and layout.current_version(root) == versions[-1]
    assert index.upsert([Document("after", "cat dog mat")]) == 1
    index.close()


def test_a_cancel_just_before_publishing_publishes_nothing(tmp_path: Path, tiny_encoder) -> None:
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert([Document(f"d{i}", r["text"]) for i, r in enumerate(tiny_documents(20))])
    versions = layout.all_versions(root)

    finished: list[int] = []

    def cancel_at_the_end(done: int, total: int) -> None:
        if total and done == total:
            finished.append(done)
            if len(finished) == 2:  # embedding reported done; this is the report before publishing
                raise InterruptedError("shutting down")

    with pytest.raises(InterruptedError):
        index.rebuild(cancel_at_the_end)
    assert finished == [20, 20]
    assert layout.all_versions(root) == versions and layout.current_version(root) == versions[-1]
    index.close()
