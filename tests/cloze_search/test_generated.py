"""The client's derived files are what tools/generate_client.py makes now: ``_async_client.py`` from
``Client`` and ``models.py`` from the service's OpenAPI. A hand edit of either, a ``Client`` change without its
twin, or a schema the models no longer match fails here with the diff (the fix: ``python -m
tools.generate_client``)."""

from __future__ import annotations

import inspect

import pytest

import cloze_search
from tools import generate_client


@pytest.mark.parametrize("target", sorted(generate_client.TARGETS))
def test_generated_file_is_current(target):
    found = generate_client.differences([target])
    assert not found, f"run `python -m tools.generate_client {target}`:\n{found.get(target, '')[-6000:]}"


def test_the_twins_have_the_same_methods_signatures_and_docstrings():
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(f) for name, f in vars(cls).items() if not name.startswith("_")}

    sync, awaited = public(cloze_search.Client), public(cloze_search.AsyncClient)
    assert sync.keys() == awaited.keys() and "upload_snapshot" in awaited
    for name in sync:
        assert str(sync[name]).replace("Iterator", "AsyncIterator") == str(awaited[name]), name
        method = getattr(cloze_search.AsyncClient, name)
        assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name
        assert getattr(cloze_search.Client, name).__doc__, f"Client.{name} has no docstring"
        assert getattr(cloze_search.Client, name).__doc__ == method.__doc__, name


def test_the_models_read_and_write_json_by_their_annotations():
    answer = {
        "results": [
            {
                "id": "a", "score": 0.5, "chunk": "c", "chunk_index": 0, "metadata": {}, "highlights": [[0, 1]],
                "explain": {"dense_score": None, "dense_rank": None, "bm25_score": 2.0, "bm25_rank": 1,
                            "fused_score": 0.5, "added_by_a_newer_service": 1},
                "added_by_a_newer_service": True,
            }
        ],
        "took_ms": 1.0,
        "mode": "bm25",
    }  # fmt: skip
    results = cloze_search.SearchResults.from_json(answer)
    (hit,) = results
    assert hit.highlights == [(0, 1)] and isinstance(hit.explain, cloze_search.Explanation)
    assert cloze_search.Explanation.from_json(hit.explain.to_json()) == hit.explain  # required nulls kept
    vector = (value for value in (1, 2))  # any iterable of numbers goes as floats
    assert cloze_search.Document("d", vector=vector).to_json() == {  # type: ignore[arg-type]
        "id": "d", "text": "", "metadata": {}, "vector": [1.0, 2.0],
    }  # fmt: skip
    assert cloze_search.Rerank(20).to_json() == {"candidates": 20, "text": "document"}  # None left out
