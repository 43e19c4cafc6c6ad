"""Reads the structure of a FAISS file before FAISS does, for the index types this service writes.

FAISS allocates what a file declares before it reads the bytes (a 338-byte file can declare 2^28 floats,
and it accepts declarations up to 2^40 bytes). So a file from outside (a restored archive) is walked here
first: every array's declared length must fit in the bytes the file has left, the dimension must be the
collection's, the metric inner product, the type the one its factory names, and the walk must end exactly at
the file's end. Only the layouts of ``IDMap2`` over ``Flat`` / ``HNSW``, ``IVF,Flat`` and ``IVF,PQ`` (the
factory grammar's) are accepted; anything else is refused. An HNSW graph's entry point and neighbour ids are
FAISS's own reader's to check (faiss-cpu >= 1.15.1, which pyproject requires, refuses ids outside the graph).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import IO

from index.storage.factories import MAX_LISTS, PQ_BITS

METRIC_INNER_PRODUCT = 0
MAX_DIMENSION = 1 << 16


class FaissFileProblem(ValueError):
    """What is wrong with the file, in words."""


class Walker:
    def __init__(self, handle: IO[bytes], size: int):
        self.handle, self.left = handle, size

    def take(self, count: int, what: str) -> bytes:
        if count > self.left:
            raise FaissFileProblem(f"{what} declares {count} bytes where {self.left} are left in the file")
        data = self.handle.read(count)
        if len(data) != count:
            raise FaissFileProblem(f"the file ends inside {what}")
        self.left -= count
        return data

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def skip(self, count: int, what: str) -> None:
        if count > self.left:
            raise FaissFileProblem(f"{what} declares {count} bytes where {self.left} are left in the file")
        while count:
            block = self.handle.read(min(count, 1 << 20))
            if not block:
                raise FaissFileProblem(f"the file ends inside {what}")
            count -= len(block)
            self.left -= len(block)

    def array(self, item_bytes: int, what: str) -> int:
        """A FAISS vector: its length (a size_t), then its items; returns the length."""
        length = self.number("Q", what)
        if length > self.left // item_bytes:
            raise FaissFileProblem(
                f"{what} declares {length} items ({length * item_bytes} bytes) where {self.left} bytes are left"
            )
        self.skip(length * item_bytes, what)
        return length

    def small_array(self, fmt: str, what: str, most: int) -> list[int]:
        length = self.number("Q", what)
        if length > most or length * struct.calcsize(fmt) > self.left:
            raise FaissFileProblem(f"{what} declares {length} items")
        return list(struct.unpack(f"<{length}{fmt}", self.take(length * struct.calcsize(fmt), what)))

    def fourcc(self) -> str:
        return self.take(4, "an index type").decode("latin-1")

    def header(self, dimension: int, what: str) -> int:
        """FAISS's index header; returns ``ntotal``."""
        d = self.number("i", f"{what} dimension")
        ntotal = self.number("q", f"{what} ntotal")
        self.skip(16, f"{what} header")
        self.number("B", f"{what} is_trained")
        metric = self.number("i", f"{what} metric")
        if d != dimension:
            raise FaissFileProblem(f"{what} has dimension {d}, the collection {dimension}")
        if metric != METRIC_INNER_PRODUCT:
            raise FaissFileProblem(f"{what} uses metric {metric}, not inner product")
        if ntotal < 0:
            raise FaissFileProblem(f"{what} declares {ntotal} vectors")
        return ntotal

    def flat(self, dimension: int, what: str) -> int:
        kind = self.fourcc()
        if kind != "IxFI":
            raise FaissFileProblem(f"{what} is of type {kind!r}, not an inner-product flat index")
        ntotal = self.header(dimension, what)
        groups = self.array(4, f"{what} vectors")  # FAISS counts flat codes in 4-byte groups
        if groups != ntotal * dimension:
            raise FaissFileProblem(
                f"{what} holds {groups // max(dimension, 1)} vectors, its header says {ntotal}"
            )
        return ntotal

    def hnsw(self, dimension: int) -> int:
        ntotal = self.header(dimension, "the HNSW index")
        self.array(8, "HNSW level probabilities")
        self.array(4, "HNSW neighbours per level")
        if self.array(4, "HNSW levels") != ntotal:
            raise FaissFileProblem("the HNSW graph's levels do not match its vector count")
        if self.array(8, "HNSW offsets") != ntotal + 1:
            raise FaissFileProblem("the HNSW graph's offsets do not match its vector count")
        self.array(4, "HNSW neighbours")
        self.skip(20, "HNSW settings")
        if self.flat(dimension, "the HNSW storage") != ntotal:
            raise FaissFileProblem("the HNSW storage and graph hold different counts")
        return ntotal

    def ivf(self, kind: str, dimension: int) -> tuple[int, int]:
        """``IwFl`` or ``IwPQ``: (ntotal, lists)."""
        ntotal = self.header(dimension, "the IVF index")
        lists = self.number("Q", "IVF lists")
        self.number("Q", "IVF nprobe")
        if not 1 <= lists <= MAX_LISTS:
            raise FaissFileProblem(f"the IVF index declares {lists} lists (at most {MAX_LISTS})")
        centroids = self.flat(dimension, "the IVF quantiser")
        if centroids not in (0, lists):
            raise FaissFileProblem(f"the IVF quantiser holds {centroids} centroids for {lists} lists")
        direct_map = self.number("B", "IVF direct map type")
        self.array(8, "IVF direct map")
        if direct_map == 2:
            self.array(16, "IVF direct map table")
        code_size = dimension * 4
        if kind == "IwPQ":
            self.number("B", "IVF-PQ by_residual")
            code_size = self.number("Q", "IVF-PQ code size")
            self.product_quantiser(dimension, code_size)
        stored = self.inverted_lists(lists, code_size)
        if stored != ntotal:
            raise FaissFileProblem(f"the IVF lists hold {stored} vectors, the header says {ntotal}")
        return ntotal, lists

    def product_quantiser(self, dimension: int, code_size: int) -> None:
        d, segments, bits = (self.number("Q", f"PQ {name}") for name in ("dimension", "segments", "bits"))
        if d != dimension or not 1 <= segments <= dimension or dimension % segments:
            raise FaissFileProblem(f"the product quantiser has dimension {d} and {segments} segments")
        if not PQ_BITS[0] <= bits <= PQ_BITS[1] or code_size != (segments * bits + 7) // 8:
            raise FaissFileProblem(f"the product quantiser has {bits} bits and code size {code_size}")
        if self.array(4, "PQ centroids") != d * (1 << bits):
            raise FaissFileProblem("the product quantiser's centroids do not match its shape")

    def inverted_lists(self, lists: int, code_size: int) -> int:
        kind = self.fourcc()
        if kind != "ilar":
            raise FaissFileProblem(f"inverted lists of type {kind!r}, not in-memory array lists")
        if self.number("Q", "list count") != lists or self.number("Q", "list code size") != code_size:
            raise FaissFileProblem("the inverted lists do not match the IVF index")
        layout = self.fourcc()
        if layout == "full":
            sizes = self.small_array("Q", "list sizes", lists)
            if len(sizes) != lists:
                raise FaissFileProblem("the inverted lists' sizes do not match the list count")
        elif layout == "sprs":
            pairs = self.small_array("Q", "list sizes", 2 * lists)
            sizes = [0] * lists
            for position in range(0, len(pairs) - 1, 2):
                if pairs[position] >= lists:
                    raise FaissFileProblem("a sparse list size names a list that does not exist")
                sizes[pairs[position]] = pairs[position + 1]
        else:
            raise FaissFileProblem(f"inverted lists of layout {layout!r}")
        for size in sizes:
            if size > self.left // (code_size + 8):
                raise FaissFileProblem(f"an inverted list declares {size} vectors past the file's end")
            self.skip(size * (code_size + 8), "an inverted list")
        return sum(sizes)


def check_faiss_file(path: Path, dimension: int, family: str) -> int:
    """Walk the FAISS file at ``path``: ``FaissFileProblem`` naming what is wrong, else its ``ntotal``.
    ``family`` is what the sidecar's factory says it is: ``flat``, ``hnsw``, ``ivf-flat`` or ``ivf-pq``."""
    if not 1 <= dimension <= MAX_DIMENSION:
        raise FaissFileProblem(f"dimension {dimension} is out of range")
    size = Path(path).stat().st_size
    with Path(path).open("rb") as handle:
        walker = Walker(handle, size)
        kind = walker.fourcc()
        expected = {"flat": "IxM2", "hnsw": "IxM2", "ivf-flat": "IwFl", "ivf-pq": "IwPQ"}[family]
        if kind != expected:
            raise FaissFileProblem(f"the file holds an index of type {kind!r}, its factory says {family}")
        if kind == "IxM2":
            ntotal = walker.header(dimension, "the id map")
            inner = walker.fourcc() if family == "hnsw" else None
            if inner is not None and inner != "IHNf":
                raise FaissFileProblem(f"the id map holds an index of type {inner!r}, not HNSW")
            if inner is None:
                held = walker.flat(dimension, "the flat index")
            else:
                held = walker.hnsw(dimension)
            if held != ntotal or walker.array(8, "the id map") != ntotal:
                raise FaissFileProblem("the id map and the index it wraps hold different counts")
        else:
            ntotal, _ = walker.ivf(kind, dimension)
        if walker.left:
            raise FaissFileProblem(f"{walker.left} bytes follow the index")
    return ntotal
