"""Okapi BM25's formula, written once: tantivy scores BM25 with it, and two places compute it themselves with
the same constants: the documents held beside tantivy's committed index (``index.storage.lexical``) and the
training teacher's sparse matrices (``encoder_training.adaptation.lexical_teacher``). Each function takes
scalars or numpy arrays alike."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

K1, B = 1.2, 0.75  # tantivy's, and FTS5's

Number = TypeVar("Number", float, np.ndarray)  # one figure, or one per term and document


def idf(document_frequency: Number, documents: int | float) -> Number:
    """A term's inverse document frequency among ``documents`` (Lucene's and tantivy's: never below zero)."""
    return np.log(1.0 + (documents - document_frequency + 0.5) / (document_frequency + 0.5))


def term_score(frequency: Number, term_idf: Number, length: Number, average_length: float) -> Number:
    """One term's share of a document's score: ``frequency`` times in a document of ``length`` words, among
    documents of ``average_length`` words on average."""
    norm = K1 * (1 - B + B * length / average_length)
    return frequency * (K1 + 1) / (frequency + norm) * term_idf
