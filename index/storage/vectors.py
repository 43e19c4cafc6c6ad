"""The FAISS side: which index for which corpus size, per-query search parameters, atomic save.

Inner product on L2-normalised vectors (= cosine). The factory is chosen by corpus size:

- below ``EXACT_LIMIT`` chunks: exact search (``IDMap2,Flat``): brute force is fast enough and perfect;
- up to ``PQ_LIMIT``: ``IVF<n>,Flat``, an inverted file over full vectors (unlike HNSW it supports
  ``remove_ids``, which keeps incremental deletes simple);
- above: ``IVF<n>,PQ<m>x8``: 8-bit product quantisation (48 bytes instead of 1,536 per MiniLM vector) so a
  large corpus fits in memory. Its lossy scores are repaired by re-scoring the best candidates exactly with
  the float vectors kept in SQLite (``SearchIndex`` does that, see ``rerank``).

A factory can be forced within the grammar of ``index.storage.factories``; for one without ``remove_ids`` (HNSW) deleted ids become tombstones
excluded with an ``IDSelector`` until the next rebuild. Search parameters (nprobe, efSearch, selectors)
travel in a ``SearchParameters`` object per call instead of being set on the shared index, which is what
makes concurrent searches with different settings safe.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from opentelemetry import trace

from encoder_runtime.tracing import child_span
from index.faultpoints import pause_for_tests
from index.records import DamagedFile
from index.storage.factories import check_factory_string
from index.storage.store import DocumentStore, fsync_file

logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs every CPU-feature probe at INFO
import faiss  # noqa: E402

tracer = trace.get_tracer(__name__)

EXACT_LIMIT = 50_000
PQ_LIMIT = 500_000
MAX_FILTERED_EF = 4096  # HNSW's candidate pool under a filter: past this, the exact path is the cheaper one
FILTER_WIDENING = 0.5  # nprobe / efSearch x rate ** -FILTER_WIDENING under a filter (``filtered_settings``)
MAX_EXACT_FILTERED = 4096  # flat: past this many matches one bitmap search is faster (measured crossover)
# HNSW's crossover is near sqrt(c x efSearch x n): c = 2 puts it between the 1,000 and 10,000 matches measured
# at 100,000 documents (exact scoring 1.7 vs 48-70 ms, the bitmap search 72 vs 26-30 ms).
HNSW_CROSSOVER = 2


def choose_factory(vectors: int, dimension: int) -> str:
    if vectors < EXACT_LIMIT:
        return "IDMap2,Flat"
    nlist = nlist_for(vectors)
    if vectors < PQ_LIMIT:
        return f"IVF{nlist},Flat"
    return f"IVF{nlist},PQ{pq_segments(dimension)}x8"


def nlist_for(vectors: int) -> int:
    """About 4 sqrt(n) lists, the usual FAISS guidance, as a power of two."""
    return int(2 ** round(math.log2(max(16.0, 4 * math.sqrt(max(vectors, 1))))))


def pq_segments(dimension: int) -> int:
    """8 dimensions per sub-quantiser (48 for 384-d) when it divides, else the largest divisor that fits."""
    for dims in (8, 4, 6, 12, 16, 2, 1):
        if dimension % dims == 0:
            return dimension // dims
    return dimension


def default_params(factory: str) -> dict[str, Any]:
    """Search settings that reach recall@10 >= 0.9 against exact search on real MiniLM embeddings."""
    params: dict[str, Any] = {}
    nlist = _ivf_lists(factory)
    if nlist:
        # 1/8 of the lists: recall@10 against exact search >= 0.9 with PQ + re-scoring, where 1/16 was not
        # (benchmarks/results/index_scale.json; docs/design-decisions.md).
        params["nprobe"] = max(8, min(nlist, nlist // 8))
    if "HNSW" in factory:
        params["efSearch"] = 128
    if "PQ" in factory:
        params["rerank"] = 10  # exact re-scoring of 10 x top_k candidates from the SQLite vectors
    return params


def _ivf_lists(factory: str) -> int:
    for part in factory.split(","):
        if part.startswith("IVF") and part[3:].isdigit():
            return int(part[3:])
    return 0


def training_size(factory: str) -> int:
    nlist = _ivf_lists(factory)
    if not nlist:
        return 0
    return min(max(64 * nlist, 65_536 if "PQ" in factory else 0), 300_000)


class VectorIndex:
    """A FAISS index addressed by stable int64 chunk ids, with tombstones where removal is unsupported."""

    def __init__(
        self, index: faiss.Index, factory: str, params: dict[str, Any], tombstones: set[int] | None = None
    ):
        self.index = index
        self.factory = factory
        self.params = params
        self.tombstones: set[int] = tombstones or set()

    @classmethod
    def create(cls, factory: str, dimension: int, params: dict[str, Any] | None = None) -> VectorIndex:
        """``InvalidFactory`` (a ValueError) for a factory outside the grammar of ``index.storage.factories``."""
        check_factory_string(factory, dimension)
        index = faiss.index_factory(dimension, factory, faiss.METRIC_INNER_PRODUCT)
        if hasattr(index, "do_polysemous_training"):
            # The factory turns it on for 8-bit PQ; it only serves Hamming pre-filtering (unused here) and
            # makes training take minutes instead of seconds.
            index.do_polysemous_training = False
        if faiss.try_extract_index_ivf(index) is None and not isinstance(index, faiss.IndexIDMap):
            index = faiss.IndexIDMap2(index)  # ids for flat / HNSW indexes; IVF keeps ids itself
        merged = default_params(factory) | (params or {})
        return cls(index, factory, merged)

    @property
    def dimension(self) -> int:
        return int(self.index.d)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal) - len(self.tombstones)

    @property
    def needs_training(self) -> bool:
        return not self.index.is_trained

    @property
    def lossy(self) -> bool:
        return "PQ" in self.factory or "SQ" in self.factory

    def train(self, sample: np.ndarray) -> None:
        if self.index.is_trained:
            return
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None and len(sample) < ivf.nlist:
            raise ValueError(f"{self.factory} needs at least {ivf.nlist} vectors to train, got {len(sample)}")
        self.index.train(np.ascontiguousarray(sample, dtype=np.float32))

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            self.tombstones.difference_update(int(i) for i in ids)
            self.index.add_with_ids(
                np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64)
            )

    def remove(self, ids: list[int] | np.ndarray) -> None:
        if not len(ids):
            return
        array = np.asarray(ids, dtype=np.int64)
        try:
            self.index.remove_ids(array)  # type: ignore[arg-type]  # the SWIG wrapper takes arrays too
        except RuntimeError:  # HNSW and friends: exclude at search time instead
            self.tombstones.update(int(i) for i in array)

    def search(
        self,
        query: np.ndarray,
        k: int,
        allowed: np.ndarray | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of the best ``k`` for one query; ``allowed`` (ids, or a boolean mask over ids) restricts
        the search before top-k."""
        if self.index.ntotal == 0 or k <= 0:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        settings = self.params | (overrides or {})
        keep: list[Any] = []  # selectors must outlive the search call
        selector = self._selector(allowed, keep)
        params = self._search_parameters(settings, selector)
        wanted = min(k, int(self.index.ntotal))
        attributes = {"cloze.faiss.k": wanted, "cloze.faiss.filtered": selector is not None}
        with child_span(tracer, "faiss.search", attributes) as span:
            scores, ids = self.index.search(
                np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32), wanted, params=params
            )
            found = ids[0] >= 0
            if span.is_recording():  # a count costs a pass over the ids: only for a span that keeps it
                span.set_attribute("cloze.candidates", int(found.sum()))
        return scores[0][found], ids[0][found]

    @property
    def reconstructable(self) -> bool:
        """Whether stored vectors can be read back by id, exactly (a flat or HNSW index under an id map)."""
        return isinstance(self.index, faiss.IndexIDMap2) and not self.lossy

    def exact_filter_limit(self) -> int:
        """Up to how many matches a filter is better served by scoring them exactly (read back by id) than by
        one search that skips the rest. Flat: a search compares every match anyway, so always, within a memory
        bound. HNSW: its filtered search widens the pool as the rate falls (``filtered_settings``), so its cost grows
        as the matches shrink while exact scoring's shrinks with them; they meet near sqrt(c x efSearch x n)."""
        if not self.reconstructable:
            return 0
        if "HNSW" in self.factory:
            return int(math.sqrt(HNSW_CROSSOVER * int(self.params.get("efSearch", 64)) * max(self.ntotal, 1)))
        return MAX_EXACT_FILTERED

    def reconstruct(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of ``ids`` (``reconstructable`` indexes; RuntimeError for an id not held)."""
        return self.index.reconstruct_batch(np.ascontiguousarray(ids, dtype=np.int64))

    def filtered_settings(self, rate: float, deepened: int = 0) -> dict[str, Any]:
        """Search settings for a filter matching ``rate`` of the vectors: the lists probed (IVF) and the
        candidate pool (HNSW) grow by 1 / sqrt(rate). Skipping a non-matching id costs a bit test, not a
        distance, and the filtered top 10 lie about as far out as the unfiltered top 10 / rate: a radius that
        grows far slower than 1 / rate in high dimensions. At 100k real chunks this kept recall@10 against
        exact filtered search at or above the unfiltered recall, where 1 / rate cost 10-14x the unfiltered
        time (docs/design-decisions.md). ``deepened``: how many times a search came back with fewer matches
        than asked for (its matches lie in lists or graph regions it did not reach); each multiplies by 4."""
        settings: dict[str, Any] = {}
        scale = max(rate, 1e-9) ** -FILTER_WIDENING * 4**deepened
        nlist = _ivf_lists(self.factory)
        if nlist and "nprobe" in self.params:
            settings["nprobe"] = min(nlist, math.ceil(int(self.params["nprobe"]) * scale))
        if "efSearch" in self.params:
            settings["efSearch"] = min(MAX_FILTERED_EF, math.ceil(int(self.params["efSearch"]) * scale))
        return settings

    def _selector(self, allowed: np.ndarray | None, keep: list[Any]) -> Any:
        selector: Any = None
        if allowed is not None and allowed.dtype == bool:  # a mask over ids: one bit test per candidate
            bits = np.packbits(allowed, bitorder="little")
            selector = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))  # n: bytes
            keep += [bits, selector]
        elif allowed is not None:
            selector = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
            keep.append(selector)
        if self.tombstones:
            dead = faiss.IDSelectorBatch(np.fromiter(self.tombstones, dtype=np.int64))
            alive = faiss.IDSelectorNot(dead)
            keep += [dead, alive]
            selector = alive if selector is None else faiss.IDSelectorAnd(selector, alive)
            keep.append(selector)
        return selector

    def _search_parameters(self, settings: dict[str, Any], selector: Any) -> Any:
        params: Any
        if faiss.try_extract_index_ivf(self.index) is not None:
            params = faiss.SearchParametersIVF()
            params.nprobe = int(settings.get("nprobe", 1))
        elif "HNSW" in self.factory:
            params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
            params.efSearch = int(settings.get("efSearch", 64))
        else:
            params = faiss.SearchParameters()
        if selector is not None:
            params.sel = selector
        return params

    def save(self, path: Path, meta: dict[str, Any], stage: str | None = None) -> None:
        """Write the index, then its sidecar JSON, each atomically (unique temp name, fsync, rename).

        The pair is one unit in the only sense that matters: the JSON's ``synced_seq`` is never ahead of
        the FAISS bytes. A crash between the two renames leaves new bytes with the old JSON; the changelog
        past the old sequence is still there (it is pruned only after the JSON), and its replay is
        idempotent (``changelog.apply_changes`` removes ids before re-adding them), so the open is correct.
        Unique temp names keep two processes from ever writing the same file. ``stage`` names the fault
        point between the two files (``index.faultpoints``)."""
        meta = meta | {"factory": self.factory, "params": self.params, "tombstones": sorted(self.tombstones)}
        temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            faiss.write_index(self.index, str(temporary))  # streamed to disk: no second copy in memory
            fsync_file(temporary)
            os.replace(temporary, path)
        except RuntimeError as exc:  # FAISS reports a short write (ENOSPC) as RuntimeError
            raise OSError(f"could not write {path}: {exc}") from exc
        finally:
            temporary.unlink(missing_ok=True)
        if stage:
            pause_for_tests(stage)  # the new FAISS bytes are in place, the JSON is still the old one
        atomic_write(path.with_suffix(".json"), json.dumps(meta).encode())

    @classmethod
    def load(cls, path: Path) -> tuple[VectorIndex, dict[str, Any]]:
        """The saved snapshot; ``DamagedFile`` when either file is missing or does not read back (a short
        file fails FAISS's own read checks). The store holds every vector, so the caller can rebuild it."""
        try:
            meta = json.loads(path.with_suffix(".json").read_text())
            # Read, not mapped (IO_FLAG_MMAP): a mapped IVF's lists are read-only, and every writer and replica
            # adds and removes (docs/design-decisions.md, "FAISS read whole").
            index = faiss.read_index(str(path))
            return cls(index, meta["factory"], meta["params"], set(meta.get("tombstones", []))), meta
        except (ValueError, KeyError, TypeError, RuntimeError, OSError) as exc:
            raise DamagedFile(f"FAISS snapshot {path} (or its JSON) is missing or damaged: {exc}") from exc


def atomic_write(path: Path, data: bytes) -> None:
    """Temp file of a unique name in the same folder, fsync, rename, fsync the folder."""
    handle = tempfile.NamedTemporaryFile(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    )
    temporary = Path(handle.name)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_vectors(
    store: DocumentStore, dimension: int, factory: str | None, trained: faiss.Index | None = None
) -> VectorIndex:
    """A build's stage 3 (and a version's repair): train on a sample (IVF / PQ), then add every vector the
    store holds, page by page. ``trained``: an index of the same factory whose training (``reusable_training``)
    is taken instead of training again (a replica's base ships its writer's)."""
    chunks = store.counts()["chunks"]
    factory = factory or choose_factory(chunks, dimension)
    index = VectorIndex.create(factory, dimension)
    if trained is not None and index.needs_training:
        index.index = reusable_training(trained, index.index)
    if index.needs_training:
        index.train(store.sample_vectors(max(training_size(factory), 1), dimension))
    for ids, vectors in store.iter_vectors(dimension=dimension):
        index.add(ids, vectors)
    return index


def reusable_training(trained: faiss.Index, empty: faiss.Index) -> faiss.Index:
    """``trained`` emptied (its lists reset, its training kept) to add vectors to, when its training is
    ``empty``'s factory's (``check_training``); ``ValueError`` otherwise."""
    check_training(trained, empty)
    trained.reset()
    return trained


def check_training(trained: faiss.Index, empty: faiss.Index) -> None:
    """``ValueError`` unless ``trained`` has ``empty``'s structure (the same factory: kind, dimension, metric,
    lists, code size) and finite centroids and codebooks. Training only places the centroids: any finite ones
    index every vector correctly (recall is what they decide)."""
    ivf, wanted = faiss.try_extract_index_ivf(trained), faiss.try_extract_index_ivf(empty)
    if ivf is None or wanted is None or not trained.is_trained:
        raise ValueError("not a trained inverted-file index")
    # downcast: an IndexIVFPQ's codebooks are not visible through IndexIVF
    ivf, wanted = faiss.downcast_index(ivf), faiss.downcast_index(wanted)
    shape = ("d", "nlist", "code_size", "metric_type", "by_residual")
    if type(faiss.downcast_index(trained)) is not type(faiss.downcast_index(empty)) or any(
        getattr(ivf, name) != getattr(wanted, name) for name in shape
    ):
        raise ValueError("its structure is not the factory's")
    if ivf.quantizer.ntotal != ivf.nlist:
        raise ValueError(f"{ivf.quantizer.ntotal} centroids for {ivf.nlist} lists")
    learned = [ivf.quantizer.reconstruct_n(0, ivf.nlist)]
    if isinstance(ivf, faiss.IndexIVFPQ):
        if (ivf.pq.M, ivf.pq.nbits) != (wanted.pq.M, wanted.pq.nbits):
            raise ValueError("its product quantiser is not the factory's")
        learned.append(faiss.vector_to_array(ivf.pq.centroids))
    elif not isinstance(ivf, faiss.IndexIVFFlat):
        raise ValueError(f"{type(ivf).__name__}: only IVF-Flat and IVF-PQ training is reused")
    if not all(np.isfinite(values).all() for values in learned):
        raise ValueError("a centroid or codebook holds NaN or an infinity")


def renumber_lists(
    index: faiss.Index, old_ids: np.ndarray, new_ids: np.ndarray, found: np.ndarray
) -> dict[int, tuple[int, int]]:
    """In place: each id in ``index``'s lists from ``old_ids[k]`` to ``new_ids[k]`` (a restore renumbers the
    chunks); ``ValueError`` unless the lists hold every old id exactly once and nothing else. Returns where
    each of the new ids ``found`` is: (list, offset)."""
    ivf = faiss.extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    if not isinstance(lists, faiss.ArrayInvertedLists) or index.ntotal != len(old_ids):
        raise ValueError(f"{index.ntotal} vectors in its lists for {len(old_ids)} chunks")
    order = np.argsort(old_ids, kind="stable")
    known = old_ids[order]
    seen = np.zeros(len(known), np.int64)
    where: dict[int, tuple[int, int]] = {}
    for number in range(ivf.nlist):
        size = lists.list_size(number)
        if not size:
            continue
        ids = faiss.rev_swig_ptr(lists.get_ids(number), size)  # the list's own storage, written in place
        at = np.minimum(np.searchsorted(known, ids), len(known) - 1)
        if not (known[at] == ids).all():
            raise ValueError("its lists hold an id the store does not")
        np.add.at(seen, at, 1)
        ids[:] = new_ids[order[at]]
        for offset in np.flatnonzero(np.isin(ids, found)).tolist():
            where[int(ids[offset])] = (number, offset)
    if not (seen == 1).all():
        raise ValueError("its lists miss a chunk or hold one twice")
    return where


def check_codes(
    index: faiss.Index, where: dict[int, tuple[int, int]], ids: np.ndarray, vectors: np.ndarray
) -> None:
    """``ValueError`` unless each of ``ids`` sits in the list its vector is assigned to, under the code
    encoding that vector gives: the lists are of these vectors, not of others under the same ids."""
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    assigned = ivf.quantizer.assign(vectors, 1).ravel().astype(np.int64)
    codes = np.empty((len(vectors), ivf.code_size), np.uint8)
    ivf.encode_vectors(len(vectors), faiss.swig_ptr(vectors), faiss.swig_ptr(assigned), faiss.swig_ptr(codes))
    for chunk_id, expected_list, code in zip(ids.tolist(), assigned.tolist(), codes, strict=True):
        number, offset = where[chunk_id]
        size = lists.list_size(number)
        stored = faiss.rev_swig_ptr(lists.get_codes(number), size * ivf.code_size)
        if number != expected_list or not np.array_equal(
            stored[offset * ivf.code_size : (offset + 1) * ivf.code_size], code
        ):
            raise ValueError(f"chunk {chunk_id}'s code is not its vector's")


def read_index_file(path: Path) -> faiss.Index:
    """A FAISS file; ``ValueError`` when FAISS does not read it."""
    try:
        return faiss.read_index(str(path))
    except RuntimeError as exc:
        raise ValueError(f"FAISS does not read it: {str(exc)[:120]}") from exc


def read_training(path: Path, empty: faiss.Index) -> faiss.Index:
    """The FAISS file at ``path`` emptied, when its training is reusable for ``empty``'s factory
    (``reusable_training``); ``ValueError`` naming why not (a file FAISS does not read included)."""
    return reusable_training(read_index_file(path), empty)
