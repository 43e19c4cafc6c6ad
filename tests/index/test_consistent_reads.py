"""Every search and listing sees one state of the collection while writes land (issue 67, part 1).

Writers flip two metadata fields of documents while readers search in every mode and list documents with filters
on them. ``grp`` is swapped in pairs (as many documents a -> b as b -> a in each write), so every committed state
holds exactly half the documents in each group; ``tier`` flips freely, so its counts differ from state to state.
Each answer is checked against the stored rows it returns: every returned document matches the filter by its
returned metadata; an answer on ``grp`` holds every match of its state (half the documents: each holds the query's
word and a vector); a listing's ``total`` counts its page (one page holds every match). Selecting by one state
and reading another breaks one of these.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest

from index.build.builder import attach_vectors
from index.records import Document
from index.search_index import SearchIndex
from tests.conftest import TINY_WORDS
from tests.index.test_filter_oracle import holds

DOCS = 24
GROUPS = ("a", "b")
TIERS = ({"n": 4, "flag": False}, {"n": 30, "flag": True})
FILTERS = [  # on grp: half the documents match in every state
    {"grp": "a"},
    {"$not": {"grp": "b"}},
    {"$or": [{"grp": "b"}, {"n": {"$lt": 0}}]},
]
TIER_FILTERS = [{"n": {"$gte": 25}}, {"flag": True}, {"$and": [{"flag": False}, {"n": {"$lt": 25}}]}]
MODES = ("dense", "bm25", "hybrid", "list", "facets")
ROUNDS = 400  # answers per reader; two readers
QUERY = "lighthouse"


def answer(
    index: SearchIndex, mode: str, filters: dict[str, Any], vector: np.ndarray, whole: bool
) -> str | None:
    """What is wrong with one answer (None: it holds in the state it read). ``whole``: a search on ``grp`` must
    hold every match of its state (a replica's may miss what its columns have not replayed yet: it trails)."""
    halves = filters in FILTERS
    if mode == "facets":
        return facets_problem(index, filters, halves)
    if mode == "list":
        page, _, total = index.document_page(limit=DOCS, filters=filters)
        returned = [(d.id, d.metadata) for d in page]
        if len(page) != total or (halves and total != DOCS // 2):
            return f"list {filters}: total {total}, page of {len(page)}"
    else:
        hits = index.search(vector, QUERY, top_k=DOCS, mode=mode, filters=filters, text_chars=0)
        returned = [(h.id, h.metadata) for h in hits]
        if whole and halves and len(hits) != DOCS // 2:
            return f"{mode} {filters}: {len(hits)} hits of {DOCS // 2} matches"
    wrong = [(doc_id, meta) for doc_id, meta in returned if not holds(meta, filters)]
    return f"{mode} {filters}: returned {wrong[0]}" if wrong else None


def facets_problem(index: SearchIndex, filters: dict[str, Any], halves: bool) -> str | None:
    """Facet counts and their total from one state: every document holds one ``grp`` and one ``flag``, so each
    field's counts sum to the total, and a filter on ``grp`` or ``flag`` counts only the values it allows."""
    found = index.facets(filters, ["grp", "flag"], top=5)
    total, fields = found["total"], found["fields"]
    counts = {name: {v["value"]: v["count"] for v in fields[name]["values"]} for name in ("grp", "flag")}
    if any(sum(c.values()) != total for c in counts.values()) or (halves and total != DOCS // 2):
        return f"facets {filters}: total {total}, counts {counts}"
    allowed = {"grp": {"a"} if filters in FILTERS[:2] else {"b"} if halves else set(GROUPS)}
    if filters in TIER_FILTERS:
        allowed["flag"] = {True} if filters != TIER_FILTERS[2] else {False}
    wrong = {name: set(c) - allowed[name] for name, c in counts.items() if name in allowed}
    return f"facets {filters}: counted {wrong}" if any(wrong.values()) else None


@pytest.mark.parametrize("where", ["writer", "replica"])
def test_every_answer_holds_in_the_state_it_read(tmp_path, tiny_encoder, where: str) -> None:
    """``replica``: the readers ask a read-only copy beside the writer, which follows the writer's changelog from
    a thread of its own (as the service's poll does), so its store runs ahead of its columns between polls."""
    index = SearchIndex.open(tmp_path / "idx", tiny_encoder)
    texts = {f"d{i}": f"{QUERY} {TINY_WORDS[i]} {TINY_WORDS[-i - 1]}" for i in range(DOCS)}
    vectors = dict(zip(texts, tiny_encoder.embed(list(texts.values()), normalize=True), strict=True))
    vector = tiny_encoder.embed([QUERY], normalize=True)[0]

    def write(shapes: dict[str, dict[str, Any]]) -> None:
        docs = [Document(doc_id, texts[doc_id], shape) for doc_id, shape in shapes.items()]
        chunked = index.prepare(docs)  # one chunk per document: its vector is the text's
        index.commit(attach_vectors(chunked, np.stack([vectors[d.id] for d, _ in chunked])))

    shapes = {doc_id: {"grp": GROUPS[i % 2], **TIERS[0]} for i, doc_id in enumerate(texts)}  # as stored
    write(shapes)
    read = SearchIndex.open(tmp_path / "idx", tiny_encoder, read_only=True) if where == "replica" else index
    assert index.wait_for_lexical(30) and read.wait_for_lexical(30)
    stop, bad, answers, writes, flipping = threading.Event(), [], Counter(), Counter(), threading.Lock()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            with flipping:  # ``shapes`` follows the commits: two writers never pick from a stale record
                chosen = [
                    rng.sample(sorted(d for d, s in shapes.items() if s["grp"] == g), 2) for g in GROUPS
                ]
                flipped = {
                    doc_id: {"grp": GROUPS[1 - k], **rng.choice(TIERS)}
                    for k, ids in enumerate(chosen)
                    for doc_id in ids
                }
                write(flipped)
                shapes.update(flipped)
            writes["commits"] += 1
            if read is not index:
                writes["replays"] += read.reload_if_changed()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(ROUNDS):
            mode, filters = rng.choice(MODES), rng.choice(FILTERS + TIER_FILTERS)
            try:
                problem = answer(read, mode, filters, vector, whole=read is index)
            except Exception as exc:  # noqa: BLE001  (a reader's error fails the test, not only its thread)
                problem = f"{mode} {filters}: {type(exc).__name__}: {exc}"
            answers[mode] += 1
            if problem:
                bad.append(problem)

    threads = [threading.Thread(target=writer, args=(s,)) for s in (1, 2)]
    threads += [threading.Thread(target=reader, args=(s,)) for s in (3, 4)]
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        for thread in threads[2:]:
            thread.join(60)
    finally:
        stop.set()
        for thread in threads[:2]:
            thread.join(30)
        if read is not index:
            read.close()
        index.close()
    wrong = Counter(problem.split()[0] for problem in bad)
    print(
        f"{where}: {dict(answers)} answers, {dict(wrong)} bad, {dict(writes)}, {time.monotonic() - started:.1f} s"
    )
    assert sum(answers.values()) == 2 * ROUNDS and writes["commits"] > 10
    assert not bad, f"{len(bad)} of {2 * ROUNDS} answers contradict their filter: {bad[:5]}"
