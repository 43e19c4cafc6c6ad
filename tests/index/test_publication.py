"""Which versions count as published (issue 42): a lost ``CURRENT`` is repaired to the last published
version, never to a finished build that was refused publication, and garbage collection keeps the last
published versions rather than such a draft."""

from __future__ import annotations

from pathlib import Path

import pytest

from index.build.builder import BuildOptions, VersionDraft, build_from_input
from index.records import Document, LiveWritesDuringBuild
from index.search_index import SearchIndex
from index.storage import layout
from tests.index.conftest import tiny_documents, write_jsonl


def docs(count: int, seed: int, prefix: str) -> list[Document]:
    return [Document(f"{prefix}{i}", r["text"]) for i, r in enumerate(tiny_documents(count, seed))]


def refused_build(root: Path, tmp_path: Path, live: SearchIndex, monkeypatch) -> int:
    """``cloze index build`` into the folder a live writer serves: finished, not published."""
    real_fill = VersionDraft.fill

    def fill_while_the_service_writes(self, documents, progress=None):
        live.upsert([Document("during-build", "queen king paris river")])
        return real_fill(self, documents, progress)

    monkeypatch.setattr(VersionDraft, "fill", fill_while_the_service_writes)
    corpus = write_jsonl(tmp_path / "other.jsonl", tiny_documents(9, seed=7))
    with pytest.raises(LiveWritesDuringBuild):
        build_from_input(root, corpus, live.encoder, BuildOptions(show_progress=False))
    monkeypatch.undo()
    draft = max(layout.all_versions(root))
    assert draft > layout.current_version(root) and layout.read_manifest(layout.version_dir(root, draft))
    return draft


def test_a_lost_pointer_never_serves_a_build_refused_publication(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    root = tmp_path / "idx"
    live = SearchIndex.open(root, tiny_encoder)
    live.upsert(docs(5, 1, "a"))
    live.rebuild()  # the service's version 2
    served = layout.current_version(root)
    draft = refused_build(root, tmp_path, live, monkeypatch)
    live.upsert(docs(6, 2, "b"))  # acknowledged into the published version after the refused build
    acknowledged = [d.id for d in docs(5, 1, "a") + docs(6, 2, "b")] + ["during-build"]
    live.close()
    (root / layout.POINTER).unlink()  # the service is killed and CURRENT is lost

    repairs: list[str] = []
    replica = SearchIndex.open(root, tiny_encoder, read_only=True, on_repair=repairs.append)
    assert replica.manifest["version"] == served and repairs == ["fallback-version"]
    replica.close()
    writer = SearchIndex.open(root, tiny_encoder, on_repair=repairs.append)
    try:
        assert writer.manifest["version"] == served == layout.current_version(root)
        assert all(writer.get(doc_id) is not None for doc_id in acknowledged)
        assert draft in layout.all_versions(root)  # kept for --resume, never served

        # A rebuild then keeps the version that was live and deletes the never-published draft.
        writer.rebuild()
        now = layout.current_version(root)
        assert layout.all_versions(root) == [served, now] and draft not in layout.all_versions(root)
        assert all(writer.get(doc_id) is not None for doc_id in acknowledged)
    finally:
        writer.close()


def test_a_publish_killed_between_its_mark_and_the_switch_is_withdrawn(tmp_path: Path, tiny_encoder) -> None:
    """The writer reopens on CURRENT and takes writes there; the marked version above must lose its mark,
    or a later lost pointer would prefer it to the one holding those writes."""
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(docs(4, 1, "a"))
    served = layout.current_version(root)
    with VersionDraft(root, layout.next_version(root), tiny_encoder, BuildOptions(show_progress=False)) as d:
        d.fill(iter(docs(3, 5, "x")))
        d.finish()
    layout.mark_published(root, d.number)  # killed here: CURRENT still names `served`
    index.close()
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert([Document("after", "cat dog mat")])
    index.close()
    assert not layout.is_marked_published(root, d.number) and layout.is_marked_published(root, served)
    (root / layout.POINTER).write_bytes(b"\x00garbled")
    reopened = SearchIndex.open(root, tiny_encoder)
    assert reopened.manifest["version"] == served and reopened.get("after") is not None
    reopened.close()


def test_an_index_from_before_the_marker_opens_and_is_marked_by_its_writer(
    tmp_path: Path, tiny_encoder, monkeypatch
) -> None:
    root = tmp_path / "idx"
    index = SearchIndex.open(root, tiny_encoder)
    index.upsert(docs(4, 1, "a"))
    draft = refused_build(root, tmp_path, index, monkeypatch)
    index.close()
    for version in layout.all_versions(root):  # as an older release left it: no marker anywhere
        (layout.version_dir(root, version) / layout.PUBLISHED).unlink(missing_ok=True)
    served = layout.current_version(root)
    assert layout.published_versions(root) == [served] and draft > served
    SearchIndex.open(root, tiny_encoder).close()  # no migration step: the writer marks what it serves
    assert layout.is_marked_published(root, served) and not layout.is_marked_published(root, draft)
    (root / layout.POINTER).unlink()
    reopened = SearchIndex.open(root, tiny_encoder)
    assert reopened.manifest["version"] == served and reopened.get("during-build") is not None
    reopened.close()
