"""How text becomes search terms, shared by BM25's tantivy index, highlights and the FTS5 query: one
tokenisation rule.

Words are runs of Unicode word characters, lower-cased. Very common English words are dropped from
queries (tantivy indexes them as one placeholder term, counted in a document's length only): as OR-terms
they match nearly every row and only slow BM25 down.
"""

from __future__ import annotations

import re
import threading

import Stemmer

WORD = re.compile(r"\w+", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be but by for from has have in is it its of on or that the their this to was were "
    "which with".split()
)
MAX_QUERY_TERMS = 64  # a pasted paragraph is still one bounded query
_local = threading.local()  # a PyStemmer object is not thread-safe: one per thread


def stemmer() -> Stemmer.Stemmer:
    """This thread's Snowball English stemmer: BM25's terms and highlights' stems are the same words'."""
    found = getattr(_local, "stemmer", None)
    if found is None:
        found = _local.stemmer = Stemmer.Stemmer("english")
    return found


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def query_terms(text: str) -> list[str]:
    return [w for w in words(text) if w not in STOPWORDS]


def fts_query(text: str) -> str:
    """User text -> a safe FTS5 expression: each distinct term quoted, OR-ed (BM25 then ranks by the terms
    present). Quoting every term means operators and stray quotes in user text (``"foo``, ``AND(``) are
    plain words."""
    terms = list(dict.fromkeys(query_terms(text)))[:MAX_QUERY_TERMS]
    return " OR ".join(f'"{term}"' for term in terms)
