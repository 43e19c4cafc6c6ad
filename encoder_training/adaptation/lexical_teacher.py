"""The hybrid teacher: the starting encoder's cosine plus a share of BM25, distilled into the student.

On SciFact BM25 alone beats the bundled dense encoder (docs/adapt.md), so a ranker that adds BM25's
lexical match to the starting encoder's cosine knows something the student does not. The contrastive
stage can train toward that ranker's in-batch distribution instead of MNRL's one-hot target (the way GPL
distils a cross-encoder; Wang et al. 2022), with no labels: scores are computed for the corpus-made pairs.

BM25 here is the product's (``index.storage.lexical``): Okapi (``index.text.bm25``) over Snowball stems, the
same stopwords; it is built over the training passages, as sparse matrices, so a batch's scores are one
sparse product. Each anchor's BM25 scores are divided by its best score over all passages, so the blend
weight means the same for every anchor.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import Stemmer
import torch
from scipy import sparse

from index.text.analysis import MAX_QUERY_TERMS, query_terms, words
from index.text.bm25 import idf, term_score


class Bm25Matrix:
    """BM25 of any anchor against a fixed list of passages, as ``anchors @ passages.T``."""

    def __init__(self, passages: list[str]):
        self._stemmer = Stemmer.Stemmer("english")
        self._vocabulary: dict[str, int] = {}
        counts = [Counter(self._stemmer.stemWords(query_terms(text))) for text in passages]
        for count in counts:
            for stem in count:
                self._vocabulary.setdefault(stem, len(self._vocabulary))
        lengths = np.array([len(words(text)) for text in passages], dtype=np.float64)  # stopwords count
        rows, columns, tfs = [], [], []
        for row, count in enumerate(counts):
            for stem, tf in count.items():
                rows.append(row)
                columns.append(self._vocabulary[stem])
                tfs.append(tf)
        frequencies = np.array(tfs, dtype=np.float64)
        shape = (len(passages), len(self._vocabulary))
        self.idf = idf(np.bincount(columns, minlength=shape[1]), len(passages))
        weights = term_score(frequencies, self.idf[columns], lengths[rows], max(lengths.mean(), 1.0))
        self.passages = sparse.csr_matrix((weights, (rows, columns)), shape=shape)

    def anchors(self, texts: list[str]) -> sparse.csr_matrix:
        """Each text's distinct known stems as a 0/1 row (BM25 counts a query term once)."""
        rows, columns = [], []
        for row, text in enumerate(texts):
            terms = list(dict.fromkeys(query_terms(text)))[:MAX_QUERY_TERMS]  # what the product's query gets
            for stem in set(self._stemmer.stemWords(terms)):
                if (column := self._vocabulary.get(stem)) is not None:
                    rows.append(row)
                    columns.append(column)
        shape = (len(texts), len(self._vocabulary))
        return sparse.csr_matrix((np.ones(len(rows)), (rows, columns)), shape=shape)


class LexicalTeacher:
    """Normalised BM25 of each training row's anchor (column 0) against the passages (the other columns)
    of any rows; rows are numbered as in ``train``, as the loss receives them."""

    def __init__(self, train, columns: list[str]):
        passages = sorted({row[c] for row in train for c in columns[1:]})
        position = {text: number for number, text in enumerate(passages)}
        self.bm25 = Bm25Matrix(passages)
        self.anchors = self.bm25.anchors([row[columns[0]] for row in train])
        self.best = np.ones(len(train))
        for start in range(0, len(train), 1024):  # each anchor's best score over all passages
            scores = self.anchors[start : start + 1024] @ self.bm25.passages.T
            best = scores.max(axis=1).toarray().ravel()
            self.best[start : start + len(best)] = np.where(best > 0, best, 1.0)
        self.passage_of = np.array([[position[row[c]] for c in columns[1:]] for row in train])

    def scores(self, rows: np.ndarray) -> torch.Tensor:
        """``(len(rows), len(rows) * passage columns)``: each row's anchor against the batch's passages in
        MNRL's order (every row's positive, then every row's first negative, ...), over its best score."""
        passages = self.passage_of[rows].T.ravel()
        scores = (self.anchors[rows] @ self.bm25.passages[passages].T).toarray() / self.best[rows, None]
        return torch.from_numpy(scores).float()
