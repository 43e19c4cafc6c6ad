"""Paging a search (``offset``) and listing documents (``list_documents``, ``count_documents``), including
listing while upserts and deletes land in another thread."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from index.query.ranking import Fusion
from index.records import Document, InvalidCursor, UnknownFilterField
from index.search_index import MAX_SEARCH_WINDOW, SearchIndex, decode_cursor, encode_cursor
from tests.index.conftest import tiny_documents


def docs(count: int, prefix: str = "d") -> list[Document]:
    return [
        Document(f"{prefix}{i:03d}", r["text"], {"color": r["color"], "rank": r["rank"]})
        for i, r in enumerate(tiny_documents(count))
    ]


@pytest.fixture()
def index(tmp_path: Path, tiny_encoder):
    opened = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    yield opened
    opened.close()


def test_search_pages_are_slices_of_one_ranking(index: SearchIndex, tiny_encoder) -> None:
    corpus = docs(60)
    index.upsert(corpus)
    text = corpus[5].text
    query = tiny_encoder.embed([text], normalize=True)[0]
    for mode in ("dense", "bm25", "hybrid"):
        for filters in (None, {"color": {"$ne": "red"}}):
            pages = [
                index.search(query, text, top_k=10, offset=o, mode=mode, filters=filters) for o in (0, 10, 20)
            ]
            for offset, page in zip((0, 10, 20), pages, strict=True):  # the promise, in every mode
                deep = index.search(query, text, top_k=offset + 10, mode=mode, filters=filters)
                assert [h.id for h in page] == [h.id for h in deep[offset:]], (mode, filters, offset)
            if mode != "hybrid":  # a ranking that does not depend on top_k: pages tile it exactly
                whole = index.search(query, text, top_k=30, mode=mode, filters=filters)
                assert [h.id for page in pages for h in page] == [h.id for h in whole], (mode, filters)
    assert index.search(query, "", top_k=10, offset=60) == []  # past the end: an empty page
    with pytest.raises(ValueError, match="over the limit"):
        index.search(query, "", top_k=10, offset=MAX_SEARCH_WINDOW - 9)
    with pytest.raises(ValueError, match="negative"):
        index.search(query, "", top_k=10, offset=-1)


def test_listing_is_ordered_filtered_counted_and_its_cursor_opaque(index: SearchIndex) -> None:
    index.upsert(docs(25))
    seen, cursor = [], None
    while True:
        page, cursor = index.list_documents(limit=7, cursor=cursor)
        seen += [d.id for d in page]
        if cursor is None:
            break
    assert seen == sorted(f"d{i:03d}" for i in range(25))
    green = {"color": "green", "rank": {"$gte": 10}}
    listed, cursor = index.list_documents(limit=100, filters=green)
    assert cursor is None and [d.id for d in listed] == [f"d{i:03d}" for i in range(10, 25) if i % 3 == 1]
    assert index.count_documents(green) == len(listed) and index.count_documents() == 25
    assert index.list_documents(limit=5, filters={"rank": {"$lt": 0}}) == ([], None)
    assert index.count_documents({"colour": "red"}) == 0  # a field no document has: absent, as in MongoDB
    assert index.count_documents({"colour": {"$ne": "red"}}) == 25
    with pytest.raises(UnknownFilterField):
        index.check_filter_fields({"colour": "red"})
    assert decode_cursor(encode_cursor("ünï/cödé id")) == "ünï/cödé id"
    for bad in ("%%%", "not base64!", encode_cursor("x") + "=", "", "_w"):
        with pytest.raises(InvalidCursor):
            index.list_documents(limit=5, cursor=bad) if bad else decode_cursor(bad)


def test_paging_while_writes_land_never_repeats_or_skips_a_lasting_document(index: SearchIndex) -> None:
    """Lasting documents (there the whole time, some of them rewritten) are each listed exactly once while
    another thread upserts new documents, rewrites lasting ones and deletes transient ones between pages."""
    # Interleaved ids: transient ones sort among the lasting ones, new ones before all of them, so a page
    # boundary kept as a position (OFFSET) would shift under every insert and delete behind it.
    lasting = docs(80, "m")
    transient = [Document(f"{d.id}t", d.text, d.metadata) for d in docs(40, "m")]
    index.upsert(lasting + transient)
    stop = threading.Event()
    wrote = threading.Condition()
    writes = {"count": 0}
    errors: list[BaseException] = []

    def writer() -> None:
        rng = np.random.default_rng(0)
        doomed = [transient[i].id for i in rng.permutation(len(transient))]  # behind and ahead of the cursor
        try:
            step = 0
            while not stop.is_set():
                step += 1
                new_id = f"{'az'[step % 2]}{step:04d}"  # before every lasting id, or after
                index.upsert([Document(new_id, "cat dog river", {"color": "red", "rank": step})])
                rewritten = lasting[int(rng.integers(len(lasting)))]
                index.upsert([Document(rewritten.id, rewritten.text + " king", {"step": step})])
                if doomed:
                    index.delete(doomed.pop())
                with wrote:
                    writes["count"] += 3
                    wrote.notify_all()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        listed: list[str] = []
        cursor = None
        while True:
            page, cursor = index.list_documents(limit=3, cursor=cursor)
            listed += [d.id for d in page]
            if cursor is None:
                break
            with wrote:  # at least one round of writes lands between two pages
                before = writes["count"]
                wrote.wait_for(lambda seen=before: writes["count"] > seen or bool(errors), timeout=10)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert writes["count"] >= 3 * len(lasting + transient) // 3, writes  # a round of writes per page
    assert len(listed) == len(set(listed))  # nothing repeated
    assert {d.id for d in lasting} <= set(listed)  # nothing lasting skipped


def test_explain_highlight_and_fusion_in_every_mode(index: SearchIndex, tiny_encoder) -> None:
    corpus = docs(40)
    index.upsert(corpus)
    index.wait_for_lexical()
    text = corpus[3].text
    query = tiny_encoder.embed([text], normalize=True)[0]
    plain = index.search(query, text, top_k=5, mode="hybrid")
    assert all(h.highlights is None and h.explanation is None for h in plain)  # only when asked
    for mode in ("dense", "bm25", "hybrid"):
        page = index.search(query, text, top_k=5, offset=2, mode=mode, explained=True, highlight=True)
        assert [h.id for h in page] == [h.id for h in index.search(query, text, top_k=7, mode=mode)][2:]
        for hit in page:
            why = hit.explanation
            assert why.fused_score == pytest.approx(hit.score)
            if mode == "hybrid":  # in one list at least, null in a list it was not in
                assert why.dense_rank or why.bm25_rank
            else:  # a mode ran one list: the other is null
                assert (why.dense_rank is None, why.bm25_rank is None) == (mode == "bm25", mode == "dense")
            if mode == "dense":
                assert why.dense_score == pytest.approx(hit.score)
            if mode == "bm25":
                assert why.bm25_score == pytest.approx(hit.score)
            assert hit.highlights and all(hit.chunk[a:b].lower() in text.lower() for a, b in hit.highlights)
        if mode != "hybrid":  # ranks below the page are absolute: the page starts at rank 3
            ranks = [h.explanation.dense_rank if mode == "dense" else h.explanation.bm25_rank for h in page]
            assert ranks == [3, 4, 5, 6, 7]

    convex = index.search(
        query, text, top_k=10, mode="hybrid", fusion=Fusion("convex", alpha=0.5), explained=True
    )
    for hit in convex:
        why = hit.explanation
        assert 0.0 <= hit.score <= 1.0 and why.fused_score == pytest.approx(hit.score)
    dense_only = index.search(query, text, top_k=10, mode="hybrid", fusion=Fusion("convex", alpha=1.0))
    assert [h.id for h in dense_only][:5] == [h.id for h in index.search(query, text, top_k=5, mode="dense")]
