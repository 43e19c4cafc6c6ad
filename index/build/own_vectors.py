"""Collections of the caller's own vectors: no model, one vector per document, given with each upsert.

``OwnVectors`` stands where an encoder stands (``SearchIndex``, ``VersionDraft``, snapshots): it has a
dimension and a fingerprint (``own-vectors:<metric>:<dimension>``, so a snapshot restores only into a
collection of the same shape), no tokenizer (so ``Chunker.for_encoder`` keeps each document whole: one
chunk, one vector), and it refuses to embed. Its job is to check and shape the vectors callers send.

Metrics: ``cosine`` stores and searches unit vectors (each one normalised here), ``dot`` keeps them as given,
each of length at most ``MAX_DOT_NORM``; both rank by FAISS inner product (float32), higher first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from index.records import IndexError_

METRICS = ("cosine", "dot")
MAX_DIMENSION = 8192
FLOAT32_MAX = float(np.finfo(np.float32).max)  # a larger number would be stored as an infinity
# Under dot, |a . b| <= |a| |b| <= 1e38 for any stored and query vector (and any partial sum FAISS adds up):
# below float32's 3.4e38 with room for rounding, so no score overflows to an infinity or a NaN.
MAX_DOT_NORM = 1e19


class InvalidVector(IndexError_, ValueError):
    """A supplied vector of the wrong length, with a NaN or an infinity, (cosine) of length zero or (dot) longer
    than ``MAX_DOT_NORM``.
    ``field`` names it as the request spelt it (``3.vector``, ``vector``)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


class OwnVectorsOnly(IndexError_):
    """Something asked a collection of the caller's own vectors to embed text: it has no model."""


@dataclass(frozen=True)
class OwnVectorsInfo:
    """What ``encoder.info`` says of a model, for a collection that has none."""

    fingerprint: str
    model_id: None = None
    pooling: None = None
    path: None = None


class OwnVectors:
    tokenizer = None  # no tokenizer: documents are not split (``chunking.WholeDocuments``)
    max_tokens = None

    def __init__(self, dimension: int, metric: str = "cosine"):
        if metric not in METRICS:
            raise ValueError(f"metric {metric!r}: one of {', '.join(METRICS)}")
        if not 1 <= dimension <= MAX_DIMENSION:
            raise ValueError(f"dimension {dimension}: between 1 and {MAX_DIMENSION}")
        self.dimension, self.metric = int(dimension), metric
        self.info = OwnVectorsInfo(fingerprint=f"own-vectors:{metric}:{dimension}")

    @classmethod
    def from_fingerprint(cls, fingerprint: str) -> OwnVectors | None:
        """The stand-in a fingerprint names (``own-vectors:<metric>:<dimension>``); None for a model's."""
        parts = fingerprint.split(":")
        if len(parts) != 3 or parts[0] != "own-vectors" or parts[1] not in METRICS or not parts[2].isdigit():
            return None
        try:
            return cls(int(parts[2]), parts[1])
        except ValueError:  # a dimension out of range: not one this service makes
            return None

    def embed(self, texts: Sequence[str], normalize: bool | None = True) -> Any:
        raise OwnVectorsOnly(
            "this collection holds vectors its callers supply (no model embeds its text): give each "
            "document its `vector`"
        )

    def vector(self, values: Sequence[float], field: str) -> np.ndarray:
        """One checked float32 vector, normalised for cosine; ``InvalidVector`` naming ``field`` if not fit."""
        if len(values) != self.dimension:
            raise InvalidVector(
                f"{field}: {len(values)} numbers, but this collection's vectors have {self.dimension}", field
            )
        return self.checked(np.asarray([values], dtype=np.float64), lambda _: field)[0]

    def vectors(self, rows: Sequence[Sequence[float]], fields: Sequence[str]) -> np.ndarray:
        """``vector`` for each row, stacked (shape (len(rows), dimension))."""
        if not rows:
            return np.zeros((0, self.dimension), np.float32)
        return np.stack([self.vector(row, field) for row, field in zip(rows, fields, strict=True)])

    def checked(self, matrix: np.ndarray, field_of: Callable[[int], str]) -> np.ndarray:
        """Rows of this collection's dimension checked at once, as ``vector`` checks one (a restore imports
        an archive's vectors through here); ``field_of(row)`` names the first unfit row."""
        array = np.asarray(matrix, dtype=np.float64)
        unfit = ~np.isfinite(array).all(axis=1) | (np.abs(array).max(axis=1, initial=0) > FLOAT32_MAX)
        if unfit.any():
            field = field_of(int(unfit.argmax()))
            raise InvalidVector(f"{field}: holds NaN or an infinity (or a number beyond float32)", field)
        norms = np.linalg.norm(array, axis=1)  # float64: finite for any float32 values
        if self.metric == "dot" and (norms > MAX_DOT_NORM).any():
            row = int((norms > MAX_DOT_NORM).argmax())
            raise InvalidVector(
                f"{field_of(row)}: norm {norms[row]:.3g}, over {MAX_DOT_NORM:.0e} (metric dot: a longer vector's "
                "scores would overflow float32)",
                field_of(row),
            )
        if self.metric == "cosine":
            if (norms == 0.0).any():
                field = field_of(int((norms == 0.0).argmax()))
                raise InvalidVector(f"{field}: all zeros, which has no direction (metric cosine)", field)
            array = array / norms[:, None]
        return array.astype(np.float32)
