"""Highlights: the spans of a chunk that match the query's terms under BM25's analysis."""

from __future__ import annotations

from index.query.highlight import highlight_spans


def marked(text: str, query: str) -> list[str]:
    return [text[start:end] for start, end in highlight_spans(text, query)]


def test_stems_match_every_form_of_a_query_word() -> None:
    text = "Running dogs run; a dog runs, the runner ran."
    assert marked(text, "running dogs") == ["Running", "dogs", "run", "dog", "runs"]
    assert marked(text, "DOG") == ["dogs", "dog"]  # case folded
    assert marked(text, "cats") == []


def test_stop_words_are_never_highlighted() -> None:
    text = "The state of the union is strong"
    assert marked(text, "the state of the union") == ["state", "union"]
    assert highlight_spans(text, "the of is") == []  # a query of stop words marks nothing
    assert highlight_spans(text, "") == []


def test_offsets_index_the_original_text_through_unicode() -> None:
    text = "😀 Café naïve Ünïcödé — İstanbul 東京"
    assert marked(text, "café") == ["Café"]  # after an astral emoji: code-point offsets
    assert marked(text, "NAÏVE ünïcödé") == ["naïve", "Ünïcödé"]
    assert marked(text, "東京") == ["東京"]
    plain = "😀 Café Ünïcödé"  # lower-casing keeps its length: the whole-text path
    assert marked(plain, "CAFÉ ünïcödé") == ["Café", "Ünïcödé"]
    # "İ" lower-cases to two code points (the word-by-word path); BM25 reads "i̇stanbul" as "i" + "stanbul": the original word is marked
    spans = highlight_spans(text, "stanbul")
    assert [text[a:b] for a, b in spans] == ["İstanbul"]
    assert all(text[a:b] for a, b in spans)


def test_spans_are_sorted_disjoint_and_repeated_terms_count_once() -> None:
    text = "dog dog-dog dogs_dog"
    spans = highlight_spans(text, "dog dog dogs")
    assert [text[a:b] for a, b in spans] == ["dog", "dog", "dog"]  # "dogs_dog" is one word (\w joins _)
    assert all(a < b for a, b in spans)
    assert all(prev[1] < nxt[0] for prev, nxt in zip(spans, spans[1:], strict=False))
    adjacent = "vitamin deficiency"
    assert highlight_spans(adjacent, "vitamin deficiency") == [(0, 7), (8, 18)]  # neighbours stay two spans
