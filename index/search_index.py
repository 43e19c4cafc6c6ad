"""``SearchIndex``: the object the service holds. Dense, BM25 and hybrid search over one published version,
durable incremental updates, background rebuilds and pickup of versions published elsewhere.

The jobs live in their own files: ``version`` (one opened version), ``changelog`` (how writes reach FAISS
and BM25), ``ranking`` (dense ranking and fusion), ``results`` (hit assembly), ``builder`` (making and
publishing a version). This file holds the lifecycle and the locking that ties them together.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from opentelemetry import trace

from encoder_runtime.tracing import child_span
from index.archive.importer import ImportRules
from index.archive.restore import ExpectedModel, check_restored, open_restored, verify_archive
from index.archive.snapshots import take_snapshot
from index.build.builder import (
    BuildOptions,
    VersionDraft,
    attach_vectors,
    chunk_documents,
    chunk_texts,
    create_empty_version,
)
from index.build.own_vectors import OwnVectors
from index.query.ranking import Fusion, Ranked, Scored, dense_ranking, explain, fuse, fusion_depth
from index.query.results import assemble_hits
from index.records import (
    DamagedFile,
    Document,
    DocumentLimits,
    DocumentStoreError,
    InvalidCursor,
    Landed,
    ReadOnlyIndex,
    SearchHit,
)
from index.storage import layout
from index.storage.changelog import (
    ChangeBatch,
    apply_changes,
    copy_changes,
    read_changes,
    snapshot_if_due,
    write_changes,
)
from index.storage.columns import Selection
from index.storage.filters import EVERYTHING, Filter, as_tree
from index.storage.layout import REBUILD_MARKER
from index.storage.locks import ReadWriteLock
from index.storage.version import OpenVersion, Repair, check_model, report_repair
from index.text.chunking import Chunker

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
Mode = Literal["dense", "bm25", "hybrid"]
T = TypeVar("T")
# A search that finds the store ahead of the columns waits for the write's catch-up (milliseconds) and starts
# again; the last attempt runs as it is, its hits checked against their rows.
READ_ATTEMPTS, CATCH_UP_WAIT_S = 3, 1.0
# Deepest result a search reaches: offset + top_k. Each page ranks from the top (offset + top_k documents per
# list, 3x that for hybrid fusion), so deep pages cost what one large top_k costs; past this, list documents
# (``list_documents``) or narrow the filter.
MAX_SEARCH_WINDOW = 1000
MAX_LIST_LIMIT = 1000
MAX_PAGE_BYTES = 8 << 20  # texts and metadata of one page of documents (the service's CLOZE_MAX_PAGE_BYTES)


class SearchIndex:
    def __init__(
        self,
        root: Path,
        encoder: Any,
        version: OpenVersion,
        lease: layout.WriterLease | None = None,
        on_repair: Repair | None = None,
        limits: DocumentLimits | None = None,
    ):
        self.root = Path(root)
        self.encoder = encoder
        self.limits = limits or DocumentLimits()  # what a restore's import lets one document hold
        self._live = version
        self._lease = lease  # this process's writer lock (None: read-only)
        self._on_repair = on_repair
        self._broken: set[int] = set()  # published versions that would not open: not retried every 2 s
        self._chunkers: dict[tuple[int | None, int | None], Chunker] = {}
        self._rw = ReadWriteLock()
        self._mutate = threading.RLock()  # one writer at a time: SQLite commit + FAISS catch-up
        self._caught_up = threading.Condition()  # told when a write's catch-up ends (``_landing`` cleared)
        self._landing = False  # a write is between its start and the end of its catch-up

    # ---- lifecycle ----------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        root: Path,
        encoder: Any,
        *,
        create: bool = True,
        read_only: bool = False,
        on_repair: Repair | None = None,
        limits: DocumentLimits | None = None,
    ) -> SearchIndex:
        """A writer takes the index's writer lock for its lifetime (``IndexLocked`` when another process
        holds it). ``read_only``: for replicas, beside a live writer or on a read-only volume; nothing is
        written, the store is read as a WAL reader beside a writer (``DocumentStore.immutable``), and the writer's
        changes arrive through its changelog (``reload_if_changed``) as well as new published versions.

        Opening repairs what a crash or a damaged disk left: a lost or garbled ``CURRENT`` (the newest
        complete version serves), a version that will not open (the newest older one serves), a FAISS
        snapshot that is missing, damaged or disagrees with SQLite (rebuilt from the store's vectors).
        ``on_repair`` is told the reason of each (the service counts them). ``limits``: what one document may
        hold, checked of every document a restore imports (the service passes its own settings)."""
        root = Path(root)
        lease = None if read_only else layout.WriterLease(root)
        try:
            version = _open_current(root, encoder, create, read_only, on_repair)
            index = cls(root, encoder, version, lease, on_repair, limits)
            with index._mutate:
                index._catch_up()
                index._live.verify()
            if lease is not None:
                layout.settle_publication(root, version.number)
                _discard_abandoned_rebuilds(root, version.number)
                for stale in version.folder.glob(".*.tmp"):  # a killed snapshot's temp file: ours to delete
                    stale.unlink(missing_ok=True)
            return index
        except BaseException:
            if lease is not None:
                lease.release()
            raise

    @property
    def chunker(self) -> Chunker:
        """Chunks new documents the way the live version was built (its manifest's window and overlap)."""
        build = self._live.manifest.get("build", {})
        shape = (build.get("chunk_window"), build.get("chunk_overlap"))
        if shape not in self._chunkers:  # a tokenizer copy each: made once per shape, not per upsert
            self._chunkers[shape] = Chunker.for_encoder(self.encoder, shape[1], shape[0])
        return self._chunkers[shape]

    def wait_for_lexical(self, timeout: float | None = None) -> bool:
        """Until BM25's tantivy index is ready (built when its folder lacked one; FTS5 answers meanwhile): for
        runs that must score one ranker."""
        return self._live.lexical.wait(timeout)

    def require_writable(self) -> None:
        """The one read-only check: every write (and the service, before it accepts one) asks here."""
        if self._live.read_only:
            raise ReadOnlyIndex("the index is open read-only: change documents through the indexer")

    def close(self) -> None:
        try:
            with self._mutate, self._rw.write():
                self._live.close(save=True)
        finally:
            if self._lease is not None:
                self._lease.release()

    @property
    def manifest(self) -> dict[str, Any]:
        return self._live.manifest | self.stats()

    # The reads below hold the readers' lock as searches do: a swap (a rebuild, a restore, a replica's reload)
    # closes the version it replaced once no reader holds it, and a store closed under a query can crash.

    def stats(self) -> dict[str, int]:
        with self._rw.read():
            live = self._live
            return live.store.counts() | {"vectors": live.vectors.ntotal}

    def metadata_fields(self) -> set[str]:
        with self._rw.read():
            self._live.store.refresh_fields()
            return self._live.store.fields()

    def check_filter_fields(self, filters: Filter | dict[str, Any] | None) -> None:
        """``UnknownFilterField`` for a field no document of this index ever had: the strict reading a service
        may ask for (by default such a field is MongoDB's absent field, matching nothing)."""
        tree = as_tree(filters)
        if tree is not None:
            with self._rw.read():
                self._live.store.check_fields(tree)

    def get(self, doc_id: str) -> Document | None:
        with self._rw.read():
            return self._live.store.get(doc_id)

    def reload_if_changed(self) -> bool:
        """Cheap (one small file, one indexed query): adopt a newly published version, or replay new changes.
        A published version that does not open is reported once and skipped; the live one keeps serving."""
        number = layout.current_version(self.root)
        if number is not None and number != self._live.number and number not in self._broken:
            manifest = layout.read_manifest_safely(layout.version_dir(self.root, number)) or {}
            if manifest:
                check_model(manifest, self.encoder, self.root)
            try:
                fresh = OpenVersion(self.root, number, self._live.read_only, self._on_repair)
            except OPEN_ERRORS as exc:
                self._broken.add(number)
                report_repair(self._on_repair, "unopenable-version", f"published version {number}: {exc}")
                return False
            with self._mutate:
                if self._live.number == number:  # this process published it meanwhile (a restore, a rebuild)
                    old, swapped = fresh, False  # readers hold the live copy: never close that one under them
                else:
                    old, swapped = self._swap(fresh), True
                    self._catch_up()
                    self._live.verify()
            old.close(save=False)
            return swapped
        with self._mutate:
            return self._catch_up() > 0

    def probe(self) -> None:
        """Raises when the live version cannot be read the way searches read it (the store's tables, FTS5
        joined to documents, the changelog): the service reports itself not ready until it can again."""
        with self._rw.read():
            store = self._live.store
            store.counts()
            store.bm25("readiness probe", 1, None)
            store.max_seq()

    def _swap(self, fresh: OpenVersion) -> OpenVersion:
        with self._rw.write():
            old, self._live = self._live, fresh
        return old

    def _catch_up(self) -> int:
        """Replay the changelog onto the live version, then save FAISS when due. Caller holds _mutate."""
        applied = self._replay()
        snapshot_if_due(self._live)
        return applied

    def _replay(self) -> int:
        live = self._live
        if live.store.writer_appeared:  # a replica read the store as immutable; a writer has opened it since
            log.info("a writer opened version %s: reading it as a WAL reader from now on", live.number)
            self._swap(OpenVersion(self.root, live.number, live.read_only)).close(save=False)
        elif live.applied_seq < live.store.pruned_through():  # another writer pruned what we had not applied
            log.info("changelog pruned past this copy of version %s: reloading it", live.number)
            self._swap(OpenVersion(self.root, live.number, live.read_only)).close(save=False)
        return apply_changes(self._live, self._rw)

    # ---- updates ------------------------------------------------------------------------------------

    def upsert(self, docs: list[Document]) -> int:
        """Embed in this process (outside any lock), commit to SQLite (durable), then apply to FAISS
        (searchable). The service embeds elsewhere, through its batcher: ``prepare``, then ``commit``."""
        chunked = self.prepare(docs)
        texts = chunk_texts(chunked)
        empty = np.zeros((0, self.encoder.dimension), np.float32)
        return self.commit(
            attach_vectors(chunked, self.encoder.embed(texts, normalize=True) if texts else empty)
        ).upserted

    def prepare(self, docs: list[Document]) -> list[tuple[Document, list]]:
        """The documents to write (the last of a repeated id wins, as sequential upserts would), each with its
        chunks as the live version chunks them; ``chunk_texts`` of this is what to embed, normalised."""
        self.require_writable()
        unique = list({d.id: d for d in docs}.values())
        return chunk_documents(self.chunker, unique)

    def commit(self, items: list[tuple[Document, list, np.ndarray]]) -> Landed:
        """Write embedded documents (``attach_vectors(prepare(docs), vectors)``): SQLite, then FAISS."""
        self.require_writable()

        def write() -> None:
            store = self._live.store
            with store.transaction() as conn:  # StorageError (disk full): nothing written, nothing to undo
                store.write_documents(conn, items, log=True)
            layout.pause_for_tests("upsert")  # durable in SQLite, not yet in FAISS

        with self._mutate:
            return Landed(len(items), self._write("an upsert", write)[1])

    def delete(self, doc_id: str) -> bool:
        self.require_writable()

        def write() -> list[int] | None:
            store = self._live.store
            with store.transaction() as conn:
                return store.delete_document(conn, doc_id, log=True)

        with self._mutate:
            return self._write("a delete", write)[0] is not None

    def _write(self, what: str, write: Callable[[], T]) -> tuple[T, bool]:
        """``write`` commits one store transaction; its catch-up (BM25, FAISS, columns) follows. A search that
        starts in between finds the store ahead of the columns and waits for the catch-up (``_consistent``).
        Also whether the catch-up succeeded (``_apply_landed``). Caller holds _mutate."""
        with self._caught_up:
            self._landing = True
        try:
            result = write()
            searchable = self._apply_landed(what)
        finally:
            with self._caught_up:
                self._landing = False
                self._caught_up.notify_all()
        snapshot_if_due(self._live)  # after the waiting searches went on: saving FAISS can take a while
        return result, searchable

    def _apply_landed(self, what: str) -> bool:
        """The catch-up after a commit; whether it succeeded (the write is searchable). The write has landed
        (durable in the store and its changelog), so a FAISS or BM25 failure here must not report it lost: it
        is logged and counted, and the changelog is replayed again (removing before adding, in case the
        failure left half of it applied) by the next write, the next poll or the next open. Caller holds
        _mutate."""
        try:
            self._replay()
        except Exception as exc:  # noqa: BLE001  (any failure of the derived copies, a MemoryError included)
            self._live.replaying = True
            log.exception("%s is committed; applying it to the search structures failed (retried)", what)
            report_repair(self._on_repair, "catch-up-failed", f"{what}: {type(exc).__name__}: {exc}")
            return False
        return True

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Re-embed every document into a new version with the live version's build options; searches and
        writes continue on the old one meanwhile.

        Writes acknowledged during the rebuild are in the old store's changelog past the snapshot sequence;
        they are copied (with their vectors) into the new version under the writer lock, and the new version
        is opened, published and swapped in under that same lock: no write can land on the old version
        once ``CURRENT`` names the new one. A rebuild that fails (a full disk) deletes its version folder.

        ``progress(done, total)`` is called while documents are read (0, 0), after each embedded slice of
        chunks, and once more just before the publishing step; an exception it raises cancels the rebuild
        (nothing published, the draft deleted): how the service stops a rebuild when it shuts down.
        """
        self.require_writable()
        with layout.build_lock(self.root):
            with self._mutate:
                old = self._live
                snapshot_seq = old.store.max_seq()
                old.pins.append(snapshot_seq)  # snapshots must not prune what copy_changes will read
            options = BuildOptions.reproducing(old.manifest, show_progress=False)
            number = layout.next_version(self.root)
            fresh: OpenVersion | None = None
            try:
                with VersionDraft(self.root, number, self.encoder, options, origin="rebuild") as draft:
                    layout.pause_for_tests("rebuild")
                    draft.fill(_reporting(old.store.iter_documents(), progress), progress)
                    vectors = draft.build_vectors()
                    with self._mutate:
                        if progress:  # the last point a cancel is honoured: from here it publishes
                            chunks = draft.store.counts()["chunks"]
                            progress(chunks, chunks)
                        copy_changes(old, draft.store, vectors, snapshot_seq)
                        manifest = draft.finish(vectors)
                        draft.store.close()
                        fresh = OpenVersion(self.root, number, False, self._on_repair)
                        self._publish_and_swap(fresh)
            except BaseException:
                if self._live is not fresh:  # never published: the old version stays, the draft goes
                    if fresh is not None:
                        fresh.close(save=False)
                    layout.remove_version(self.root, number)
                raise
            finally:
                with self._mutate:
                    old.pins.remove(snapshot_seq)
        old.close(save=False)
        return manifest

    def snapshot(self, folder: Path, compression: str = "none", keep: int | None = None) -> dict[str, Any]:
        """A backup archive of the live version in ``folder`` (``index.archive.snapshots``): every write acknowledged
        before the call, none after it; searches and writes go on while it is written."""
        return take_snapshot(lambda: self._live, self._mutate, folder, compression, keep)

    def restore(self, archive: Path, private: bool = False) -> dict[str, Any]:
        """Replace the collection with the snapshot in ``archive``: verified whole before anything is written
        (``BadArchive`` names the problem; the live version is untouched), its rows imported into a new
        version, each checked as an upsert into this collection checks it (``import_rules``), then
        published and swapped in under the writer lock, as a rebuild is. Writes acknowledged between the
        snapshot and this restore are not in it: that is what a restore (a rollback) means. ``private``: the
        archive is the caller's own file, which nothing else changes (a replica's download): its data is
        checksummed once, as it is extracted into the unpublished draft, not also before."""
        self.require_writable()
        expected = ExpectedModel(self.encoder.info.fingerprint, int(self.encoder.dimension))
        info = verify_archive(archive, expected, self.root, data_checksums=not private)
        rules = import_rules(self.encoder, self.limits)
        with layout.build_lock(self.root):
            number = layout.next_version(self.root)
            fresh: OpenVersion | None = None
            try:
                fresh = open_restored(self.root, number, archive, info, rules, self._on_repair, private)
                check_restored(fresh, info)
                layout.pause_for_tests("restore")  # complete on disk, not published
                with self._mutate:
                    old = self._live
                    self._publish_and_swap(fresh)
            except BaseException:
                if self._live is not fresh:
                    if fresh is not None:
                        fresh.close(save=False)
                    layout.remove_version(self.root, number)
                raise
        old.close(save=False)
        log.info("restored snapshot (sequence %s) as version %s", info.get("sequence"), number)
        return {"version": number, **{k: info.get(k) for k in ("sequence", "documents", "chunks")}}

    def _publish_and_swap(self, fresh: OpenVersion) -> None:
        """Caller holds _mutate. An error after ``CURRENT`` switched still swaps: the pointer decides."""
        try:
            layout.publish(self.root, fresh.number)
        except Exception:
            if layout.current_version(self.root) != fresh.number:
                raise
            log.exception(
                "version %s is published, but publishing reported an error after the switch", fresh.number
            )
        layout.pause_for_tests("swap")  # published, the service still on the old version
        self._swap(fresh)

    # ---- replication (index.replication: a copy on another host) -----------------------------------

    def changes_after(self, seq: int, most: int | None = None) -> tuple[int, ChangeBatch]:
        """The live version's number and its documents changed after ``seq`` as they are now
        (``index.storage.changelog.read_changes``), read while no write lands: one state of the store."""
        with self._mutate:
            live = self._live
            return live.number, read_changes(live.store, live.vectors.dimension, seq, most)

    def apply_batch(self, batch: ChangeBatch, state: dict[str, str]) -> None:
        """Another index's changes (with their vectors) and ``state`` in one transaction, then FAISS and BM25
        caught up through the changelog as after any write (a failed catch-up is replayed, as after any write):
        readers see all of the batch or none of it."""
        self.require_writable()

        def write() -> None:
            write_changes(self._live.store, None, batch, log=True, state=state)

        with self._mutate:
            self._write("a replicated batch", write)

    def position(self) -> tuple[int, int]:
        """The live version's number and its last changelog sequence. Under the readers' lock (callers ask from
        worker threads: /readyz's replication state, acks, the shipper): a restore or rebuild closes the
        version it replaced only once no reader holds it, and a store closed under a query can crash."""
        with self._rw.read():
            live = self._live
            return live.number, live.store.max_seq()

    def state(self, key: str) -> str | None:
        """A value the live version's store keeps beside the documents (``apply_batch``'s ``state``)."""
        with self._rw.read():
            return self._live.store.get_state(key)

    # ---- search -------------------------------------------------------------------------------------

    def search(
        self,
        query_vector: np.ndarray | None,
        query_text: str,
        *,
        top_k: int = 10,
        mode: Mode = "dense",
        filters: Filter | dict[str, Any] | None = None,
        offset: int = 0,
        fusion: Fusion | None = None,
        explained: bool = False,
        highlight: bool = False,
        text_chars: int | None = None,
    ) -> list[SearchHit]:
        """Results ``offset`` .. ``offset + top_k`` of the ranking a search with ``top_k = offset + top_k``
        returns (so pages are slices of one ranking). The filter (a request's JSON, or its tree parsed already:
        ``InvalidFilterValue``) is applied before ranking in every mode, as one ``Selection`` they all consume.
        ``fusion`` merges hybrid's lists (RRF with k = 60 by default); ``explained`` sets each hit's
        ``explanation`` and ``highlight`` its ``highlights`` (the chunk's spans that match query terms);
        ``text_chars`` cuts each hit's document text (0 when the caller shows none: a long text is not read)."""
        if mode not in ("dense", "bm25", "hybrid"):
            raise ValueError(f"unknown search mode {mode!r} (dense, bm25 or hybrid)")
        if mode != "bm25" and query_vector is None:
            raise ValueError(f"mode {mode!r} needs a query vector")
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        if offset + top_k > MAX_SEARCH_WINDOW:
            raise ValueError(f"offset + top_k is {offset + top_k}, over the limit of {MAX_SEARCH_WINDOW}")
        if top_k <= 0:
            return []
        window = offset + top_k
        tree = as_tree(filters)

        def ranked_hits(live: OpenVersion) -> list[SearchHit]:
            dense: Ranked | None = None
            sparse: Scored | None = None
            selection = _selected(live, tree)  # the filter evaluated once, for both rankers
            vector = query_vector
            if mode == "dense":
                ranked = dense = _dense(live, vector, window, selection)
            elif mode == "bm25":
                sparse = _bm25(live, query_text, window, selection)
                ranked = [(d, s, None) for d, s in sparse]
                vector = None  # BM25 hits pick their chunk by shared terms
            else:
                depth = fusion_depth(window)
                dense = _dense(live, vector, depth, selection)
                sparse = _bm25(live, query_text, depth, selection)
                ranked = _fused(dense, sparse, fusion or Fusion())
            page = ranked[offset:window]
            return assemble_hits(
                live,
                page,
                vector,
                query_text,
                explanations=explain(page, dense, sparse) if explained else None,
                highlight=highlight,
                text_chars=text_chars,
            )

        attributes = {"cloze.search.mode": mode, "cloze.search.k": top_k, "cloze.search.offset": offset}
        with child_span(tracer, "index.search", attributes) as span:
            hits = self._consistent(ranked_hits, tree)
            span.set_attribute("cloze.results", len(hits))
            return hits

    def _consistent(
        self, search: Callable[[OpenVersion], list[SearchHit]], tree: Filter | None
    ) -> list[SearchHit]:
        """``search`` over one state: the columns, FAISS and BM25 (fixed while the readers' lock is held) and the
        store's rows (one read snapshot) at the same changelog point. A write commits before its catch-up takes
        the write lock, so a snapshot taken in between is ahead: the search waits for the catch-up and starts
        again. A replica does not wait for its next poll, nor does anyone for a catch-up that failed: such a
        search runs as it is, its hits checked against their rows (``still_matching``)."""
        for attempt in range(READ_ATTEMPTS):
            with self._rw.read(), self._live.store.snapshot():
                live = self._live
                ahead = live.store.max_seq() != live.applied_seq  # the snapshot's first read fixes it
                if not ahead or live.read_only or attempt == READ_ATTEMPTS - 1:
                    hits = search(live)
                    return still_matching(live, hits, tree) if ahead else hits
            with self._caught_up:
                self._caught_up.wait_for(lambda: not self._landing, timeout=CATCH_UP_WAIT_S)
        raise AssertionError("unreachable: the last attempt searches")

    def facets(
        self, filters: Filter | dict[str, Any] | None, fields: list[str], top: int = 10
    ) -> dict[str, Any]:
        """Over the documents matching ``filters`` (every one without): ``total`` of them and, per field, its
        type, its ``top`` most frequent values (documents per value), and its least and greatest number and
        date, read from the in-memory columns (a field holding an integer past 2**53: its numbers from the store)."""
        tree = as_tree(filters) or EVERYTHING
        with self._rw.read(), self._live.store.snapshot():
            live = self._live
            documents = live.select(tree).documents
            return {
                "total": int(np.count_nonzero(documents)),
                "fields": live.columns.facets(documents, fields, top, live.store),
            }

    # ---- listing ------------------------------------------------------------------------------------

    def list_documents(
        self,
        limit: int = 100,
        cursor: str | None = None,
        filters: Filter | dict[str, Any] | None = None,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> tuple[list[Document], str | None]:
        """One page of the documents matching ``filters``, in a stable order (by id), and the cursor of the
        next page (None after the last): at most ``limit`` documents, fewer when their texts and metadata
        pass ``max_bytes`` (always at least one). A document that exists the whole time a client pages is listed
        exactly once, whatever is upserted, deleted or rebuilt meanwhile; ``InvalidCursor`` for a cursor
        this index did not hand out, ``UnknownFilterField`` / ``InvalidFilterValue`` as for search."""
        page, next_cursor, _ = self._page(limit, cursor, filters, max_bytes, counted=False)
        return page, next_cursor

    def document_page(
        self,
        limit: int = 100,
        cursor: str | None = None,
        filters: Filter | dict[str, Any] | None = None,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> tuple[list[Document], str | None, int]:
        """``list_documents``' page and cursor with ``total``, the count of every match: both read from one
        snapshot of the store, so the total counts the collection the page was drawn from."""
        return self._page(limit, cursor, filters, max_bytes, counted=True)

    def _page(
        self,
        limit: int,
        cursor: str | None,
        filters: Filter | dict[str, Any] | None,
        max_bytes: int,
        counted: bool,
    ) -> tuple[list[Document], str | None, int]:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit {limit} is outside 1..{MAX_LIST_LIMIT}")
        after = decode_cursor(cursor) if cursor else None
        tree = as_tree(filters)
        with self._rw.read(), self._live.store.snapshot():
            store = self._live.store
            page = store.list_documents(limit + 1, after, tree, max_bytes)
            total = store.count_documents(tree) if counted else -1
        kept, size = 0, 0
        for document in page[:limit]:
            size += len(document.text) + len(json.dumps(document.metadata))
            if kept and size > max_bytes:
                break
            kept += 1
        more = len(page) > kept
        page = page[:kept]
        return page, encode_cursor(page[-1].id) if more else None, total

    def count_documents(self, filters: Filter | dict[str, Any] | None = None) -> int:
        """How many documents match ``filters`` (all of them without one): the listing's total."""
        tree = as_tree(filters)
        with self._rw.read():
            return self._live.store.count_documents(tree)


def still_matching(live: OpenVersion, hits: list[SearchHit], tree: Filter | None) -> list[SearchHit]:
    """For a search whose snapshot of the store is ahead of the columns (a replica until its next poll, a failed
    catch-up until it is replayed): the hits whose rows, as read, no longer match the filter are dropped."""
    if tree is None or not hits:
        return hits
    keep = live.store.matching_documents([hit.id for hit in hits], tree)
    return [hit for hit in hits if hit.id in keep]


# The steps of a search, each a span when the request is traced (encoder_runtime.tracing): what each cost,
# and how many candidates each handed on.


def _selected(live: OpenVersion, tree: Filter | None) -> Selection | None:
    """The filter evaluated once, for both rankers."""
    if tree is None:
        return None
    with child_span(tracer, "index.filter") as span:
        selection = live.select(tree)
        if selection is not None and span.is_recording():  # a count is a pass over every row
            span.set_attribute("cloze.filter.documents", int(np.count_nonzero(selection.documents)))
        return selection


def _dense(live: OpenVersion, vector: np.ndarray | None, depth: int, selection: Selection | None) -> Ranked:
    with child_span(tracer, "index.dense", {"cloze.search.depth": depth}) as span:
        ranked = dense_ranking(live, vector, depth, selection)
        span.set_attribute("cloze.candidates", len(ranked))
        return ranked


def _bm25(live: OpenVersion, text: str, depth: int, selection: Selection | None) -> Scored:
    with child_span(tracer, "index.bm25", {"cloze.search.depth": depth}) as span:
        scored = live.bm25(text, depth, selection)
        span.set_attribute("cloze.candidates", len(scored))
        span.set_attribute("cloze.bm25.in_memory", live.lexical.ready)
        return scored


def _fused(dense: Ranked, sparse: Scored, fusion: Fusion) -> Ranked:
    attributes = {
        "cloze.fusion": fusion.label(),
        "cloze.fusion.dense": len(dense),
        "cloze.fusion.bm25": len(sparse),
    }
    with child_span(tracer, "index.fusion", attributes) as span:
        ranked = fuse(dense, sparse, fusion)
        span.set_attribute("cloze.candidates", len(ranked))
        return ranked


def encode_cursor(doc_id: str) -> str:
    """Opaque to clients (they pass it back as is); today the last listed id, base64url without padding."""
    return base64.urlsafe_b64encode(doc_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        doc_id = raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidCursor(f"cursor {cursor[:40]!r} was not handed out by this index") from exc
    if not doc_id or encode_cursor(doc_id) != cursor:
        raise InvalidCursor(f"cursor {cursor[:40]!r} was not handed out by this index")
    return doc_id


def _reporting(
    documents: Iterator[Document], progress: Callable[[int, int], None] | None
) -> Iterator[Document]:
    """The documents, with ``progress(0, 0)`` every few hundred of them (it may raise to cancel)."""
    for count, document in enumerate(documents, 1):
        if progress and count % 256 == 0:
            progress(0, 0)
        yield document


OPEN_ERRORS = (OSError, ValueError, KeyError, sqlite3.Error, DocumentStoreError, DamagedFile)


def import_rules(encoder: Any, limits: DocumentLimits) -> ImportRules:
    """What a restore into a collection of ``encoder`` checks of each imported document: an upsert's rules.
    A collection of the caller's own vectors takes documents without text and checks vectors its own way."""
    if isinstance(encoder, OwnVectors):
        return ImportRules(limits, text_required=False, vectors=encoder.checked)
    return ImportRules(limits)


def _open_current(
    root: Path, encoder: Any, create: bool, read_only: bool, on_repair: Repair | None
) -> OpenVersion:
    """The version ``CURRENT`` names; else (pointer lost or garbled, version unopenable) the newest
    published one that opens, with ``CURRENT`` repaired to name it when this process is the writer."""
    problem = layout.pointer_problem(root)
    number = layout.current_version(root)
    if problem is None and number is None:
        if not create or read_only:
            raise FileNotFoundError(f"no published index in {root}")
        number = _create_empty(root, encoder)
    finished = layout.finished_versions(root)
    if problem is None:  # CURRENT, else the published versions before it
        candidates = [number, *[v for v in reversed(layout.published_versions(root)) if v < number]]
    else:  # never a version that was refused publication (layout.repair_candidates)
        candidates = layout.repair_candidates(root)
    failures: list[str] = [problem] if problem else []
    for candidate in candidates:
        manifest = layout.read_manifest_safely(layout.version_dir(root, candidate))
        if manifest is None:
            failures.append(f"version {candidate} has no readable manifest")
            continue
        check_model(manifest, encoder, root)  # a model mismatch is a configuration error, not damage
        try:
            version = OpenVersion(root, candidate, read_only, on_repair)
        except OPEN_ERRORS as exc:
            failures.append(f"version {candidate} does not open: {exc}")
            continue
        if candidate != number or problem:
            report_repair(
                on_repair, "fallback-version", f"{'; '.join(failures)}: serving version {candidate}"
            )
            if not read_only:
                layout.point_to(root, candidate)
        return version
    if problem and not finished and create and not read_only:  # a garbled pointer and nothing published
        return OpenVersion(root, _create_empty(root, encoder), read_only, on_repair)
    raise DocumentStoreError(f"no version of the index in {root} opens: {'; '.join(failures)}")


def _discard_abandoned_rebuilds(root: Path, current: int) -> None:
    """A service rebuild killed before its swap leaves its version folder above ``CURRENT``; it will never
    be published (``cloze index build`` drafts stay: ``--resume`` continues them). Skipped while a build runs."""
    handle = layout.try_build_lock(root)
    if handle is None:
        return
    try:
        for version in layout.all_versions(root):
            if version > current and (layout.version_dir(root, version) / REBUILD_MARKER).exists():
                log.info("removing version %s, left by an interrupted rebuild", version)
                layout.remove_version(root, version)
    finally:
        handle.close()


def _create_empty(root: Path, encoder: Any) -> int:
    """An empty, published version 1 (exact index), so a service can start before any build."""
    return create_empty_version(root, encoder, BuildOptions(show_progress=False))
