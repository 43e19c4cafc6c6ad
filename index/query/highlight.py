"""Highlights: the character spans of a chunk that match the query's terms, as BM25 matches them.

The same analysis as BM25's index (``index.text.analysis``'s words, its stop words, Snowball English stems):
"running dogs" marks "run", "runs" and "dog"; a stop word is never marked. Offsets are Python string indices
(Unicode code points), ``[start, end)``, sorted, never overlapping.
"""

from __future__ import annotations

import re

from index.text.analysis import MAX_QUERY_TERMS, STOPWORDS, WORD, query_terms, stemmer


def highlight_spans(text: str, query: str) -> list[tuple[int, int]]:
    """``[start, end)`` spans of ``text`` whose word shares a stem with a query term (at most the terms BM25
    would get). Words are found in the original text, so offsets index it even where lower-casing changes a
    string's length (``"İ".lower()`` is two code points); touching spans are merged."""
    terms = list(dict.fromkeys(query_terms(query)))[:MAX_QUERY_TERMS]
    if not terms:
        return []
    stems = stemmer()
    wanted = set(stems.stemWords(terms))
    lowered = text.lower()
    if len(lowered) == len(text):  # each character lower-cases to one: offsets carry over, words are words()
        distinct = list(set(WORD.findall(lowered)) - STOPWORDS)
        hit = [w for w, stem in zip(distinct, stems.stemWords(distinct), strict=True) if stem in wanted]
        if not hit:
            return []
        pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, hit)) + r")(?!\w)")
        return [m.span() for m in pattern.finditer(lowered)]  # whole words, so never overlapping
    # "İ" lower-cases to "i̇" (two code points, which words() reads as "i" + a new word): word by word, and any
    # piece matching marks the whole original word.
    matches = list(WORD.finditer(text))
    pieces = [[w for w in WORD.findall(m.group().lower()) if w not in STOPWORDS] for m in matches]
    distinct = list({w for group in pieces for w in group})
    matched = {w for w, stem in zip(distinct, stems.stemWords(distinct), strict=True) if stem in wanted}
    spans: list[tuple[int, int]] = []
    for match, group in zip(matches, pieces, strict=True):
        if any(w in matched for w in group):
            start, end = match.span()
            if spans and spans[-1][1] >= start:
                spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
            else:
                spans.append((start, end))
    return spans
