"""Batch builds: corpus -> new version directory -> atomic publish. Memory is bounded by a batch, not the corpus.

A build runs in stages, each checkpointed in the version's own SQLite store, so ``--resume`` after a crash
(even SIGKILL) continues where the last commit left off:

1. ingest: documents are read as a stream, chunked, and committed in batches with a counter of records
   consumed, in the same transaction (resume skips exactly that many records);
2. embed: chunks whose vector is still NULL are embedded page by page, locally (a reader thread and a
   writer thread keep SQLite off the encoder's critical path) or on Ray (``index.build.ray_engine``);
3. vectors: a FAISS index of the factory chosen for the corpus size is trained on a sample and filled page
   by page from the stored vectors;
4. publish: manifest written last, everything fsync'd, then the ``CURRENT`` pointer is switched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from index.build.ingest import corpus_checksum, iter_documents
from index.build.ray_engine import embed_pending_with_ray
from index.records import Document, IndexLocked, LiveWritesDuringBuild, check_document
from index.storage import layout
from index.storage.columns import Columns
from index.storage.layout import FORMAT_VERSION, REBUILD_MARKER
from index.storage.store import DocumentStore
from index.storage.vectors import VectorIndex, build_vectors
from index.text.chunking import Chunker

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]
INGEST_BATCH = 512
EMBED_PAGE = 2048
# Texts handed to the encoder at once. Its forward passes run on one FIFO pool that the service's own
# upserts share: a whole page (2,048 chunks, hundreds of passes) queued there made a 5-document upsert
# wait for all of it during a rebuild (seconds on two cores). A slice is a few passes per core;
# it is also how often a rebuild can be cancelled.
EMBED_SLICE = 64


@dataclass
class BuildOptions:
    factory: str | None = None  # None: chosen by corpus size at each build
    engine: str = "local"  # "local" | "ray"
    batch_tokens: int | None = None
    resume: bool = False
    overlap: int | None = None  # chunk overlap in tokens; None: a quarter of the window
    window: int | None = None  # tokens per chunk; None: the model's window
    show_progress: bool = True
    ray_actors: int | None = None

    @classmethod
    def reproducing(cls, manifest: dict[str, Any], **overrides: Any) -> BuildOptions:
        """The options a published version was built with (its manifest's ``build``), for a rebuild."""
        build = manifest.get("build", {})
        return cls(
            factory=build.get("factory"),
            overlap=build.get("chunk_overlap"),
            window=build.get("chunk_window"),
            **overrides,
        )


class VersionDraft:
    """One new version directory from creation to publish: the one path every build takes (``cloze index
    build``, a service rebuild, the empty first version). Nobody reads it before ``publish``."""

    def __init__(self, root: Path, number: int, encoder: Any, options: BuildOptions, origin: str = "build"):
        self.root, self.number, self.encoder, self.options = Path(root), number, encoder, options
        self.folder = layout.version_dir(self.root, number)
        self.folder.mkdir(parents=True, exist_ok=True)
        if origin == "rebuild":
            (self.folder / REBUILD_MARKER).touch()
        self.store = DocumentStore(self.folder / layout.STORE)
        self.chunker = Chunker.for_encoder(encoder, options.overlap, options.window)

    def __enter__(self) -> VersionDraft:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()

    @property
    def finished(self) -> bool:
        return layout.read_manifest(self.folder) is not None

    def fill(self, documents: Iterator[Document], progress: Progress | None = None) -> dict[str, float]:
        """Stages 1 and 2: chunk and store the documents, then embed every chunk (both resumable).
        Returns the seconds each took in this run."""
        started = time.perf_counter()
        ingest(self.store, documents, self.chunker, self.options)
        ingested = time.perf_counter()
        embed_stage(self.store, self.encoder, self.options, progress)
        return {"ingest": round(ingested - started, 3), "embed": round(time.perf_counter() - ingested, 3)}

    def build_vectors(self) -> VectorIndex:
        return build_vectors(self.store, self.encoder.dimension, self.options.factory)

    def finish(
        self,
        vectors: VectorIndex | None = None,
        input_checksum: str | None = None,
        stage_seconds: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        """Stage 3 + the manifest (the completeness marker). ``vectors``: already built by the caller."""
        started = time.perf_counter()
        if self.store.count_pending():
            raise RuntimeError(f"{self.store.count_pending()} chunks still have no vector")
        index = vectors or self.build_vectors()
        index.save(self.folder / layout.VECTORS, {"synced_seq": self.store.max_seq()})
        Columns.save_from_store(self.store, self.folder)
        manifest = make_manifest(self.number, self.store, self.encoder, index, self.chunker, self.options)
        seconds = (stage_seconds or {}) | {"vectors": round(time.perf_counter() - started, 3)}
        manifest |= {"input_checksum": input_checksum, "stage_seconds": seconds}
        layout.write_manifest(self.folder, manifest)
        return manifest

    def publish(self) -> None:
        layout.publish(self.root, self.number)


def create_empty_version(root: Path, encoder: Any, options: BuildOptions) -> int:
    """An empty, published first version, so a service can serve (and take writes) before any build. Its
    vectors are exact until the first rebuild when the factory must be trained (IVF, PQ); the manifest keeps
    the factory, window and overlap asked for, and every later build and rebuild uses them."""
    with layout.build_lock(root):
        existing = layout.current_version(root)
        if existing is not None:
            return existing
        vectors = VectorIndex.create(options.factory or "IDMap2,Flat", encoder.dimension)
        if vectors.needs_training:
            vectors = VectorIndex.create("IDMap2,Flat", encoder.dimension)
        with VersionDraft(root, layout.next_version(root), encoder, options) as draft:
            draft.finish(vectors)
            draft.publish()
        return draft.number


def build_from_input(root: Path, input_path: Path, encoder: Any, options: BuildOptions) -> dict[str, Any]:
    """``cloze index build``: a new version from ``input_path``, published atomically. Returns its manifest."""
    root = Path(root)
    checksum = corpus_checksum(input_path)
    with layout.build_lock(root):
        baseline = _live_position(root)
        number = _resumable(root, checksum, encoder.info.fingerprint) if options.resume else None
        if number is None:
            _discard_unfinished(root)
            number = layout.next_version(root)
        with VersionDraft(root, number, encoder, options) as draft:
            if draft.finished:
                manifest = layout.read_manifest(draft.folder) or {}
            else:
                _stamp(draft.store, checksum, encoder.info.fingerprint)
                seconds = draft.fill(iter_documents(input_path))
                manifest = draft.finish(input_checksum=checksum, stage_seconds=seconds)
            _publish_unless_written_meanwhile(draft, baseline)
        return manifest


def _live_position(root: Path) -> tuple[int, int] | None:
    """(published version, its last changelog sequence): how far the live index has been written."""
    number = layout.current_version(root)
    path = layout.version_dir(root, number) / layout.STORE if number is not None else None
    if number is None or path is None or not path.is_file():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)  # not immutable: a live writer's WAL counts
    try:
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changelog'").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return number, int(row[0]) if row else 0


def _publish_unless_written_meanwhile(draft: VersionDraft, baseline: tuple[int, int] | None) -> None:
    """A build publishes a new corpus; it does not carry over what a live writer acknowledged while it ran.
    So it publishes only holding the writer lock (no write can slip in between the check and the switch)
    and only when the live index took no write since the build began; otherwise the finished version
    stays unpublished and ``--resume`` publishes it once the writer has stopped."""
    try:
        lease = layout.WriterLease(draft.root)
    except IndexLocked as exc:
        raise LiveWritesDuringBuild(
            f"{exc}; version {draft.number} was built but not published, since a write that process "
            "acknowledged during the switch would be lost. Stop it and run again with --resume, or rebuild "
            "through the service (POST /index/rebuild keeps live writes)"
        ) from exc
    try:
        now = _live_position(draft.root)
        if baseline is not None and now is not None and now[0] == baseline[0] and now[1] > baseline[1]:
            raise LiveWritesDuringBuild(
                f"the live index at {draft.root} acknowledged writes while this build ran (changelog "
                f"{baseline[1]} -> {now[1]}); publishing would drop them, so version {draft.number} was not "
                "published. Add those documents to the input and build again, or stop the writer and run "
                "with --resume to publish this build without them; POST /index/rebuild keeps live writes"
            )
        draft.publish()
    finally:
        lease.release()


def build_if_needed(out: Path, input_path: Path, encoder: Any, options: BuildOptions) -> dict[str, Any]:
    """The published manifest when ``out`` already holds this input and model, else a fresh build."""
    manifest = current_manifest(out)
    if manifest and is_built_from(manifest, input_path, encoder.info.fingerprint):
        return manifest
    return build_from_input(out, input_path, encoder, options)


def current_manifest(root: Path) -> dict[str, Any] | None:
    number = layout.current_version(root)
    return layout.read_manifest(layout.version_dir(root, number)) if number is not None else None


def is_built_from(manifest: dict[str, Any], input_path: Path, model_fingerprint: str) -> bool:
    """Cheap (hashes the input, loads no model): is this version the build of these bytes by this model?"""
    return (
        manifest.get("input_checksum") == corpus_checksum(input_path)
        and manifest.get("model_fingerprint") == model_fingerprint
    )


def _stamp(store: DocumentStore, checksum: str, fingerprint: str) -> None:
    with store.transaction() as conn:
        store.set_state(conn, "input_checksum", checksum)
        store.set_state(conn, "model_fingerprint", fingerprint)


def _resumable(root: Path, checksum: str, fingerprint: str) -> int | None:
    """The newest unpublished version built from the same input and model, if any."""
    current = layout.current_version(root) or 0
    for version in reversed(layout.all_versions(root)):
        if version <= current:
            break
        store_path = layout.version_dir(root, version) / layout.STORE
        if not store_path.is_file():
            continue
        store = DocumentStore(store_path)
        try:
            same = (store.get_state("input_checksum"), store.get_state("model_fingerprint")) == (
                checksum,
                fingerprint,
            )
        finally:
            store.close()
        if same:
            log.info("resuming unfinished version %s", version)
            return version
    log.info("nothing to resume in %s: starting a new version", root)
    return None


def _discard_unfinished(root: Path) -> None:
    current = layout.current_version(root) or 0
    for version in layout.all_versions(root):
        if version > current and layout.read_manifest(layout.version_dir(root, version)) is None:
            shutil.rmtree(layout.version_dir(root, version), ignore_errors=True)


def ingest(
    store: DocumentStore, documents: Iterator[Document], chunker: Chunker, options: BuildOptions
) -> int:
    """Stage 1: chunk and commit documents; the consumed-record counter commits with them (the checkpoint)."""
    done = int(store.get_state("ingested", "0") or 0)
    if store.get_state("ingest_complete") == "1":
        return done
    stream = islice(documents, done, None)
    bar = _bar(options, "ingest", "doc", None, done)
    while batch := list(islice(stream, INGEST_BATCH)):
        chunk_lists = chunker.split([d.text for d in batch])
        with store.transaction() as conn:
            store.write_documents(
                conn, [(d, c, None) for d, c in zip(batch, chunk_lists, strict=True)], log=False
            )
            done += len(batch)
            store.set_state(conn, "ingested", str(done))
        bar.update(len(batch))
        layout.pause_for_tests("ingest")
    with store.transaction() as conn:
        store.set_state(conn, "ingest_complete", "1")
    bar.close()
    return done


def embed_stage(
    store: DocumentStore, encoder: Any, options: BuildOptions, progress: Progress | None = None
) -> None:
    """Stage 2: give every chunk without a vector its vector (resumable: only NULL vectors are embedded)."""
    if options.engine == "ray":
        embed_pending_with_ray(store, encoder, options)
        return
    if options.batch_tokens:
        encoder.max_batch_tokens = options.batch_tokens
    embed_pending_locally(store, encoder, _bar(options, "embed", "chunk", store.count_pending(), 0), progress)


def embed_pending_locally(
    store: DocumentStore, encoder: Any, bar: Any, progress: Progress | None = None
) -> int:
    """Reader thread -> encoder (this thread, ``EMBED_SLICE`` texts at a time) -> writer thread, with
    queues of two pages each. ``progress`` is told after each slice; an exception it raises stops the stage.

    The encoder is the bottleneck; the threads make sure it never waits on SQLite (reads and the fsync of
    each commit overlap with the next forward passes). Memory: at most ~5 pages of text and vectors.
    """
    total = store.count_pending()
    pages: queue.Queue = queue.Queue(maxsize=2)
    results: queue.Queue = queue.Queue(maxsize=2)
    failure: list[BaseException] = []

    def read() -> None:
        after = 0
        try:
            while True:
                ids, texts = store.pending_chunks(EMBED_PAGE, after)
                if not ids:
                    break
                after = ids[-1]
                pages.put((ids, texts))
        except BaseException as exc:  # surfaced in the main thread
            failure.append(exc)
        pages.put(None)

    def write() -> None:
        while (item := results.get()) is not None:
            try:
                with store.transaction() as conn:
                    store.set_vectors(conn, *item)
            except BaseException as exc:
                failure.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    writer = threading.Thread(target=write, daemon=True)
    reader.start()
    writer.start()
    done = 0
    try:
        while (page := pages.get()) is not None:
            ids, texts = page
            parts = []
            for start in range(0, len(texts), EMBED_SLICE):
                parts.append(encoder.embed(texts[start : start + EMBED_SLICE], normalize=True))
                done += len(parts[-1])
                bar.update(len(parts[-1]))
                if progress:  # may raise to cancel (a service rebuild at shutdown)
                    progress(done, total)
            results.put((ids, np.concatenate(parts)))
            if failure:
                raise failure[0]
    finally:
        results.put(None)
        writer.join()
        reader.join(timeout=5)
        bar.close()
    if failure:
        raise failure[0]
    return done


def make_manifest(
    version: int,
    store: DocumentStore,
    encoder: Any,
    index: VectorIndex,
    chunker: Chunker,
    options: BuildOptions,
) -> dict[str, Any]:
    """What a reader needs to use the version, and (``build``) what a rebuild needs to reproduce it."""
    counts = store.counts()
    return {
        "format": FORMAT_VERSION,
        "version": version,
        "model_id": encoder.info.model_id,
        "model_fingerprint": encoder.info.fingerprint,
        "pooling": encoder.info.pooling,
        "dimension": encoder.dimension,
        "max_tokens": encoder.max_tokens,
        "metric": "inner_product",
        "normalized": True,
        "factory": index.factory,
        "search_params": index.params,
        "build": {
            "factory": options.factory,
            "chunk_window": chunker.window,
            "chunk_overlap": chunker.overlap,
        },
        "documents": counts["documents"],
        "chunks": counts["chunks"],
        "vectors": index.ntotal,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "checksum": data_checksum(store),
    }


def data_checksum(store: DocumentStore) -> str:
    """SHA-256 over (id, text, metadata) of every document: equal data, equal checksum."""
    digest = hashlib.sha256()
    for document in store.iter_documents():
        digest.update(
            json.dumps([document.id, document.text, document.metadata], sort_keys=True, default=str).encode()
        )
        digest.update(b"\n")
    return digest.hexdigest()[:32]


def _bar(options: BuildOptions, label: str, unit: str, total: int | None, initial: int) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, unit=unit, desc=label, disable=not options.show_progress, smoothing=0.1
    )


def chunk_documents(chunker: Chunker, docs: list[Document]) -> list[tuple[Document, list]]:
    """Each document with its chunks: the first half of an upsert, before anything is embedded."""
    for position, doc in enumerate(docs):
        check_document(doc, f"{position}.")
    return list(zip(docs, chunker.split([d.text for d in docs]), strict=True))


def chunk_texts(chunked: list[tuple[Document, list]]) -> list[str]:
    """The texts to embed, in order: one per chunk."""
    return [c.text for _, chunks in chunked for c in chunks]


def attach_vectors(
    chunked: list[tuple[Document, list]], vectors: np.ndarray
) -> list[tuple[Document, list, np.ndarray]]:
    """``chunk_texts``' vectors handed back to their documents: what ``DocumentStore.write_documents`` takes."""
    out, start = [], 0
    for doc, chunks in chunked:
        out.append((doc, chunks, vectors[start : start + len(chunks)]))
        start += len(chunks)
    return out


def embed_documents(
    encoder: Any, chunker: Chunker, docs: list[Document]
) -> list[tuple[Document, list, np.ndarray]]:
    """Chunk and embed a few documents at once, in this process (``cloze index add``; the service embeds
    through its batcher instead, ``SearchIndex.prepare`` / ``commit``)."""
    chunked = chunk_documents(chunker, docs)
    flat = chunk_texts(chunked)
    vectors = encoder.embed(flat, normalize=True) if flat else np.zeros((0, encoder.dimension), np.float32)
    return attach_vectors(chunked, vectors)
