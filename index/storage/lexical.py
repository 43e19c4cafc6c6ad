"""BM25 over a version's documents on tantivy (the Rust search engine's official Python bindings), on disk in
the version's folder (``lexical/``): opened in milliseconds, no build at each open, postings off the heap.

Text is analysed here exactly as before (``index.text.analysis``'s words, Snowball stems), and the stems are
indexed joined by spaces into a whitespace-tokenised field, so tantivy's terms are ours and a query is an OR of
its stems' terms. Stopwords are never query terms; each is indexed as one placeholder term, so a document's
length (BM25's normalisation) still counts every word. Scoring is tantivy's Okapi BM25, with FTS5's and our
constants (``index.text.bm25``: k1 1.2, b 0.75); tantivy stores document lengths in one byte (exact up to 40
words, within a few percent above), the one difference from the formula the training teacher uses.

SQLite stays the source of truth. The index follows the store through the changelog that keeps FAISS
current: each changed document is deleted by id and added as the store holds it now, so applying an entry
twice converges. A tantivy commit costs milliseconds of CPU and an fsync, so writes do not wait for one: the
documents changed since the last commit (at most ``COMMIT_EVERY``) are held in memory as term counts, left out
of tantivy's answers and scored beside them with the committed index's statistics, and committed in one go
when they are that many or FAISS saves its snapshot. The sidecar (``lexical/synced.json``) records the
sequence the committed index covers: a crash at any point is repaired by replaying the changelog from it. A missing, damaged or stale index is
rebuilt from the store in the background (FTS5 answers meanwhile); a read-only process keeps its own copy in
a temporary folder (the version's belongs to its writer). A filter reaches it as a mask over the store's
document rows (``index.storage.columns``): broad ones keep the matches of a deeper top list (its rids read
from tantivy's fast field), selective ones restrict the query to their rows (the filter translated into tantivy
instead: measured, not taken, docs/design-decisions.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tantivy

from index.storage.store import DocumentStore
from index.text.analysis import MAX_QUERY_TERMS, STOPWORDS, query_terms, stemmer, words
from index.text.bm25 import idf, term_score

log = logging.getLogger(__name__)
FOLDER = "lexical"  # in a version's folder
SYNCED = "synced.json"  # beside tantivy's files: the changelog sequence its last saved commit covers
FORMAT = 1  # of the schema and the terms: an index of another format is built again
STOPWORD_TERM = "-"  # every stopword's one term: \w never matches "-", so no query stem equals it
WRITER_HEAP = 64 << 20
WRITER_LOCK_WAIT_S = 1.0  # a reopened version waits for the copy it replaces to release tantivy's writer
# What a filter's two plans cost beyond a base they share (docs/design-decisions.md, filtered BM25: 100k real
# chunks, CPU p50): a widened top list 0.3 us a hit (rids read from the fast field in one call), a query
# restricted to the filter's rows 0.6 ms more plus 0.75 us a matching document (its term set). 1% of 100k:
# widened 1.1 ms, restricted 4.2 ms; 0.1%: 5.5 and 1.3 ms.
WIDEN_MS_PER_HIT, RESTRICT_MS, RESTRICT_MS_PER_MATCH = 0.0003, 0.6, 0.00075
COMMIT_EVERY = 256  # changed documents held beside the committed index before a commit
TIE_DEPTH = 10  # a top list's first search reads this many times the hits asked (``_top``)


def indexed_terms(text: str) -> str:
    """A document's terms as tantivy indexes them: its words' stems, each stopword as ``STOPWORD_TERM``."""
    tokens = words(text)
    stems = stemmer().stemWords(tokens)
    return " ".join(STOPWORD_TERM if w in STOPWORDS else s for w, s in zip(tokens, stems, strict=True))


def query_stems(text: str) -> list[str]:
    """The distinct stems of the first ``MAX_QUERY_TERMS`` distinct query terms (the terms FTS5 would get)."""
    terms = list(dict.fromkeys(query_terms(text)))[:MAX_QUERY_TERMS]
    return list(dict.fromkeys(stemmer().stemWords(terms)))


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_integer_field(
        "rid", stored=True, indexed=True, fast=True
    )  # i64: what term sets of ints match
    builder.add_integer_field("length", fast=True)  # words: the average length that scores held changes
    builder.add_text_field("stems", stored=False, tokenizer_name="whitespace", index_option="freq")
    return builder.build()


SCHEMA = _schema()


class WriterBusy(RuntimeError):
    """Another copy of the version (in this process or another) holds the folder's tantivy writer."""


Held = dict[str, "tuple[int, dict[str, int], int] | None"]  # doc_id -> (rid, term counts, length), None: gone


@dataclass(frozen=True)
class View:
    """What one search reads: a committed searcher (with its collection statistics) and the documents changed
    since its commit, at changelog point ``seq``."""

    searcher: tantivy.Searcher
    held: Held
    seq: int
    documents: int  # in the committed index
    average_length: float


@dataclass
class Pending:
    """The changelog's ``(since, through]`` handed to tantivy's writer, and the view that shows it; ``through``
    None: the changelog was pruned past ``since``, the index is built again."""

    since: int
    through: int | None
    view: View | None = None
    changed: int = 0


class LexicalIndex:
    def __init__(self, folder: Path | None = None) -> None:
        """``folder``: where the index lives (made when missing); None: a private temporary folder."""
        self._temporary = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="cloze-lexical-")) if folder is None else Path(folder)
        self._lock = threading.Lock()  # tantivy's writer: builds, staged changes and commits
        self._builder: threading.Thread | None = None
        self._stopped = threading.Event()
        self._writer: tantivy.IndexWriter | None = None
        self._view: View | None = None  # replaced whole: a search reads one
        self._swap = threading.Lock()  # replacing the view (never held through a build or a commit)
        self.ready = False
        self._staged = 0  # the changelog point of what the writer holds (never replaced by an older view)
        self.saved_seq = 0  # the point ``synced.json`` records (the changelog must be kept past it)
        self._index = self._open_existing()

    # ---- opening, building and following the store ---------------------------------------------------

    def _open_existing(self) -> tantivy.Index | None:
        """The folder's index and its sidecar's sequence when both read; None when it must be built."""
        try:
            synced = json.loads((self.folder / SYNCED).read_text())
            if synced.get("format") != FORMAT:
                raise ValueError(f"format {synced.get('format')!r}, not {FORMAT}")
            seq = int(synced["synced_seq"])
            index = tantivy.Index.open(str(self.folder))
            self._view = _view(index, {}, seq)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            if (self.folder / SYNCED).exists():
                log.warning("BM25 index %s does not open (%s): built again from the store", self.folder, exc)
            return None
        self.saved_seq = self._staged = seq
        return index

    @property
    def seq(self) -> int:
        """The changelog point searches see."""
        view = self._view
        return 0 if view is None else view.seq

    def start(self, store: DocumentStore) -> threading.Thread | None:
        """Ready at once when the folder holds an index the changelog can bring up to date; otherwise built in
        the background (queries use FTS5 until ``ready``)."""
        if self._stopped.is_set():
            return None
        if self._index is not None and not self.ready:
            if store.pruned_through() <= self.seq <= store.max_seq():
                self.ready = True  # the caller's catch-up replays the changelog past ``seq``
                return None
            log.info(
                "BM25 index %s at sequence %s, outside the changelog: built again", self.folder, self.seq
            )
        # Not ready from now, not from when the builder takes the lock: a write's sync would otherwise wait out
        # the whole build while holding the index's write lock (every search waiting behind it).
        self.ready = False
        self._builder = threading.Thread(target=self.build, args=(store,), name="lexical-index", daemon=True)
        self._builder.start()
        return self._builder

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a background build ends (tests, benchmarks); True when ready."""
        if self._builder is not None:
            self._builder.join(timeout)
        return self.ready

    def stop(self) -> None:
        """End a background build before the store closes (closing a SQLite connection under a running query
        crashes the process), then let tantivy's writer go (its lock, its merging threads)."""
        self._stopped.set()
        # A finishing build may hand over to a fresh one (sync -> start) while we wait: join until none runs.
        while (builder := self._builder) is not None and builder is not threading.current_thread():
            builder.join()
            if self._builder is builder:
                break
        with self._lock, self._swap:
            writer, self._writer = self._writer, None
            self._view = self._index = None
        if writer is not None:
            writer.wait_merging_threads()
        if self._temporary:
            shutil.rmtree(self.folder, ignore_errors=True)

    def build(self, store: DocumentStore) -> None:
        """Every document of the store into a fresh index, then the changes made meanwhile."""
        if self._stopped.is_set():
            return
        try:
            with self._lock:
                self.ready = False
                writer = self._fresh_writer()
                # Before reading, and no read transaction held through the build (it would hold the WAL back):
                # rows changed while they are read are replayed from ``seq`` by the sync below (idempotent).
                seq = store.max_seq()
                for batch in _batches(store.iter_rows(), 2000):
                    if self._stopped.is_set():
                        return
                    for rid, document in batch:
                        writer.add_document(_document(document.id, rid, indexed_terms(document.text)))
                writer.commit()
                self._staged = seq
                fresh = _view(self._index, {}, seq)
                with self._swap:
                    self._view = fresh
                self._save_locked(seq)
                self.ready = True
            self.sync(store)
            log.info("BM25 index %s ready: %d documents", self.folder, self.documents)
        except WriterBusy:
            with self._lock:
                self._go_private()
            self.build(store)
        except Exception:  # the store went away (version swapped, closed), a full disk: FTS5 keeps answering
            log.warning("BM25 index %s not built; BM25 stays on FTS5", self.folder, exc_info=True)

    def _fresh_writer(self) -> tantivy.IndexWriter:
        """The folder's index emptied, its writer held. An index that opens is emptied through its writer (an
        old copy of this version in this process may still hold it: its files are not pulled from under it);
        one that does not open is replaced. Caller holds the lock."""
        (self.folder / SYNCED).unlink(missing_ok=True)  # no sidecar: a crash mid-build builds again
        try:
            if self._index is None:
                self._index = tantivy.Index.open(str(self.folder))
            if self._index.schema != SCHEMA:
                raise ValueError("another schema")
            writer = self._writer_locked()
            writer.delete_all_documents()
            return writer
        except WriterBusy:
            raise
        except ValueError:
            if self._writer is not None:
                self._writer.wait_merging_threads()
                self._writer = None
            self._index = None
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index = tantivy.Index(SCHEMA, path=str(self.folder))
        return self._writer_locked()

    def _writer_locked(self) -> tantivy.IndexWriter:
        """Tantivy's one writer of the folder. A version reopened in this process waits for the copy it
        replaces to close and release it. Caller holds the lock."""
        if self._writer is None:
            assert self._index is not None
            deadline = time.monotonic() + WRITER_LOCK_WAIT_S
            while True:
                try:
                    self._writer = self._index.writer(WRITER_HEAP, 1)
                    break
                except ValueError as exc:
                    if "LockBusy" not in str(exc):
                        raise
                    if time.monotonic() > deadline:
                        raise WriterBusy(f"{self.folder}: {exc}") from exc
                    time.sleep(0.05)
        return self._writer

    def _go_private(self) -> None:
        """Another copy of this version writes the folder (two writable opens of one index in a process):
        this one keeps its own in a temporary folder from now on. Caller holds the lock."""
        log.warning("BM25 index %s has another writer: this copy builds its own", self.folder)
        self._index = None
        self._temporary = True
        self.folder = Path(tempfile.mkdtemp(prefix="cloze-lexical-"))

    def sync(self, store: DocumentStore) -> int:
        """Apply changelog entries past ``seq``: each changed document is re-read as it is now."""
        with store.snapshot():
            pending = self.prepare(store)
        return self.apply(pending, store)

    def prepare(self, store: DocumentStore) -> Pending | None:
        """Hand the documents changed past ``seq``, as the store holds them, to tantivy's writer, held beside
        the committed index (committed once ``COMMIT_EVERY`` are held), outside the index's write lock:
        searches keep the view they read (the state at ``seq``) until ``apply`` hands over the new one. Called
        in the caller's snapshot of the store."""
        while self.ready and not self._stopped.is_set():  # a running build replays the changelog when it ends
            since = self.seq
            if since < store.pruned_through():  # entries we needed are gone: read everything again
                return Pending(since, None)
            changes = store.changes_since(since)
            if not changes:
                return None
            doc_ids = list(dict.fromkeys(doc_id for _, doc_id, _, _ in changes))
            rows = store.query(
                "SELECT id, rid, text FROM documents WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(doc_ids),),
            )
            with self._lock:
                view = self._view
                if view is not None and view.seq > since:
                    continue  # another sync (a build's last one) moved on while we read: again from there
                return self._stage_locked(store, view, since, changes[-1][0], doc_ids, rows)
        return None

    def _stage_locked(
        self,
        store: DocumentStore,
        view: View | None,
        since: int,
        through: int,
        doc_ids: list[str],
        rows: Iterable[tuple[str, int, str]],
    ) -> Pending | None:
        """``prepare``'s changes handed to the writer. Caller holds the lock."""
        if (
            not self.ready
            or view is None
            or view.seq != since
            or self._index is None
            or through < self._staged
        ):
            return None  # ``through < _staged``: an older view of the store than the writer's
        try:
            writer = self._writer_locked()
        except WriterBusy:
            self._go_private()
            writer = None
        if writer is None:
            self.start(store)
            return None
        held: Held = {**view.held, **dict.fromkeys(doc_ids)}
        try:
            for doc_id in doc_ids:  # removed before added: a replay of what is already in converges
                writer.delete_documents_by_term("doc_id", doc_id)
            for doc_id, rid, text in rows:
                terms = indexed_terms(text)
                writer.add_document(_document(doc_id, rid, terms))
                held[doc_id] = _counted(rid, terms)
            self._staged = through
            fresh = self._commit_locked(through) if _commit_due(len(held), view.documents) else None
        except (ValueError, OSError) as exc:
            # a full disk: FAISS and the columns go on, BM25 answers from FTS5 while the index is built again
            # (the writer's uncommitted changes went with it)
            log.warning("BM25 index %s could not commit (built again): %s", self.folder, exc)
            self._drop_writer()
            self.start(store)
            return None
        next_view = fresh or View(view.searcher, held, through, view.documents, view.average_length)
        return Pending(since, through, next_view, len(doc_ids))

    def _commit_locked(self, seq: int) -> View:
        """Commit what the writer holds (the store's changes through ``seq``): a view with none held. Caller
        holds the lock."""
        assert self._writer is not None and self._index is not None
        self._writer.commit()
        return _view(self._index, {}, seq)

    def _drop_writer(self) -> None:
        """A writer whose commit failed is let go with what it had not committed. Caller holds the lock."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.rollback()
                writer.wait_merging_threads()
            except ValueError as exc:
                log.warning("BM25 index %s: its writer ended with an error: %s", self.folder, exc)

    def apply(self, pending: Pending | None, store: DocumentStore) -> int:
        """Searches see ``pending``'s state from here (the caller holds the index's write lock, so that they see
        it with FAISS and the columns at one point), unless another sync already showed a newer one."""
        if pending is None:
            return 0
        if pending.through is None:
            if self.ready and self.seq == pending.since:
                self.start(store)
            return 0
        with self._swap:  # a pending view is whole (its searcher's commit and every change since): newer wins
            if not self.ready or pending.through <= self.seq:
                return 0
            self._view = pending.view
        return pending.changed

    def save(self) -> int | None:
        """Commit the held changes and record in the sidecar that the committed index covers the changelog
        through that point (FAISS's snapshot calls this): the sequence the changelog must be kept from for this
        index, or None when it needs none: while it builds (its sidecar is gone: a crash builds it again, and
        a build replays from its own start), in a temporary folder (a restart builds it again)."""
        if not self.ready:  # a build holds the writer for its whole run: never wait for it here
            opened = self._index is not None and self._builder is None  # from disk, its catch-up to come
            return self.saved_seq if opened and not self._temporary else None
        with self._lock:
            view = self._view
            if view is not None and self._staged > self.saved_seq and self._writer is not None:
                try:
                    fresh = self._commit_locked(self._staged)
                    with self._swap:
                        if self._view is view and view.seq == self._staged:  # one state, committed alone
                            self._view = fresh
                    if self._temporary:
                        self.saved_seq = self._staged
                    else:
                        self._save_locked(self._staged)
                except (ValueError, OSError) as exc:
                    log.warning(
                        "could not save BM25's index in %s (the changelog is kept): %s", self.folder, exc
                    )
            return None if self._temporary or not self.ready else self.saved_seq

    def _save_locked(self, seq: int) -> None:
        temporary = self.folder / f".{SYNCED}.tmp"
        with temporary.open("w") as handle:
            json.dump({"synced_seq": seq, "format": FORMAT}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(self.folder / SYNCED)
        self.saved_seq = seq

    @property
    def documents(self) -> int:
        """Documents searched (deleted ones not counted)."""
        view = self._view
        if view is None:
            return 0
        stale = sum(_count(view.searcher, tantivy.Query.term_query(SCHEMA, "doc_id", d)) for d in view.held)
        return view.documents - stale + sum(entry is not None for entry in view.held.values())

    def disk_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.folder.iterdir() if f.is_file())

    # ---- search --------------------------------------------------------------------------------------

    def search(
        self,
        text: str,
        limit: int,
        only: list[str] | None = None,
        rows: np.ndarray | None = None,
        at: int | None = None,
    ) -> list[tuple[str, float]] | None:
        """Top ``limit`` (doc_id, BM25 score), best first; only documents with a query term score, and when
        ``only`` (document ids) or ``rows`` (a mask over the store's rids: a filter's matches) is given, only
        those documents (the same scores: the collection statistics stay those of every document, as FTS5's
        are). ``at``: None unless the index is at that changelog point (the caller's other copies')."""
        stems = query_stems(text)
        view = self._view  # one view for the whole search, the one at ``seq``
        if at is not None and (view is None or view.seq != at or not self.ready):
            return None
        if view is None or limit <= 0 or not stems:
            return []
        query = _any_of(stems)
        if view.held:  # their committed copies are stale: scored from the held counts instead
            stale = tantivy.Query.term_set_query(SCHEMA, "doc_id", list(view.held))
            query = tantivy.Query.boolean_query([(tantivy.Occur.Must, query), (tantivy.Occur.MustNot, stale)])
        if only is not None:
            found = _top(view.searcher, _restricted(query, "doc_id", list(dict.fromkeys(only))), limit)[0]
        elif rows is None:
            found = _top(view.searcher, query, limit)[0]
        else:
            found = _filtered(view.searcher, query, limit, rows)
        if not view.held:
            return found
        allowed = None if only is None else set(only)
        held = _score_held(view, stems, rows, allowed)
        return sorted(found + held, key=lambda hit: (-hit[1], hit[0]))[:limit]


def _commit_due(held: int, committed: int) -> bool:
    """Commit at ``COMMIT_EVERY`` held documents, or sooner while they are more than half as many as the
    committed ones: held documents count in the statistics only of their own scores, so a small collection
    (a new one) would rank unlike a copy holding the same documents committed (a replica's base)."""
    return held >= COMMIT_EVERY or 2 * held > committed


def _document(doc_id: str, rid: int, terms: str) -> tantivy.Document:
    document = tantivy.Document()
    document.add_text("doc_id", doc_id)
    document.add_integer("rid", int(rid))
    document.add_integer("length", terms.count(" ") + 1 if terms else 0)
    document.add_text("stems", terms)
    return document


def _counted(rid: int, terms: str) -> tuple[int, dict[str, int], int]:
    tokens = terms.split()
    return int(rid), Counter(t for t in tokens if t != STOPWORD_TERM), len(tokens)


def _view(index: tantivy.Index, held: Held, seq: int) -> View:
    """The index's latest commit as a view, with the statistics that score held documents beside it."""
    index.reload()
    searcher = index.searcher()
    documents = searcher.num_docs
    average = 0.0
    if documents:
        stats = searcher.aggregate(tantivy.Query.all_query(), {"length": {"avg": {"field": "length"}}})
        average = float(stats["length"]["value"] or 0.0)
    return View(searcher, held, seq, documents, average)


def _count(searcher: tantivy.Searcher, query: tantivy.Query) -> int:
    return searcher.search(query, 1, count=True).count


def _score_held(
    view: View, stems: list[str], rows: np.ndarray | None, allowed: set[str] | None
) -> list[tuple[str, float]]:
    """Okapi BM25 of the held documents (the formula tantivy scores with) with the committed index's
    collection statistics counting the held documents in, as a commit would (their stale copies too, as
    tantivy's document frequencies do until a merge drops them): each term's document frequency, the
    documents, the average length."""
    alive = [entry for entry in view.held.values() if entry is not None]
    total = max(view.documents + len(alive), 1)
    words = view.average_length * view.documents + sum(length for _, _, length in alive)
    average = words / total or 1.0
    idfs = {}
    for stem in stems:
        df = view.searcher.doc_freq("stems", stem) + sum(stem in counts for _, counts, _ in alive)
        df = min(df, total)  # tantivy's frequencies count replaced copies until a merge drops them
        idfs[stem] = float(idf(df, total))
    scored = []
    for doc_id, entry in view.held.items():
        if entry is None or (allowed is not None and doc_id not in allowed):
            continue
        rid, counts, length = entry
        if rows is not None and not (rid < len(rows) and rows[rid]):
            continue
        score = sum(term_score(counts[s], idfs[s], length, average) for s in stems if s in counts)
        if score > 0:
            scored.append((doc_id, score))
    return scored


def _batches(items: Iterable, size: int) -> Iterable[list]:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _any_of(stems: list[str]) -> tantivy.Query:
    return tantivy.Query.boolean_query(
        [(tantivy.Occur.Should, tantivy.Query.term_query(SCHEMA, "stems", stem)) for stem in stems]
    )


def _restricted(query: tantivy.Query, field: str, values: list) -> tantivy.Query:
    """``query``'s documents among those whose ``field`` is one of ``values``, scored by ``query`` alone."""
    inside = tantivy.Query.const_score_query(tantivy.Query.term_set_query(SCHEMA, field, values), 0.0)
    return tantivy.Query.boolean_query([(tantivy.Occur.Must, query), (tantivy.Occur.Must, inside)])


def _top(
    searcher: tantivy.Searcher, query: tantivy.Query, limit: int
) -> tuple[list[tuple[str, float]], list[int]]:
    """The best ``limit`` hits (doc_id, score) and their rids, ties in doc_id order: tantivy breaks them in
    index order, which differs between copies holding the same documents (a replica's base, a rebuild), so
    the hits tied with the last one kept are all read before the cut."""
    # tantivy quantises lengths, so a cut often falls in a long tie, and a deeper top list costs about the same
    # (docs/design-decisions.md): read 10x at once rather than search again.
    fetch = TIE_DEPTH * limit + 1
    found = searcher.search(query, fetch, count=False).hits
    while len(found) == fetch and found[limit - 1][0] == found[-1][0]:
        fetch *= 4
        found = searcher.search(query, fetch, count=False).hits
    last = found[min(limit, len(found)) - 1][0] if found else 0.0
    ranked = []
    for score, address in found:
        if score < last:
            break
        stored = searcher.doc(address)
        ranked.append((-float(score), stored["doc_id"][0], stored["rid"][0]))
    ranked.sort()
    return [(doc_id, -score) for score, doc_id, _ in ranked[:limit]], [rid for *_, rid in ranked[:limit]]


def widens(pool: int, matched: int) -> bool:
    """Whether a top list of ``pool`` hits costs less than a query restricted to ``matched`` documents."""
    return pool * WIDEN_MS_PER_HIT <= RESTRICT_MS + matched * RESTRICT_MS_PER_MATCH


def _filtered(
    searcher: tantivy.Searcher, query: tantivy.Query, limit: int, rows: np.ndarray
) -> list[tuple[str, float]]:
    """A filter's matches (``rows``: a mask over rids, exact, so its match rate is known): a broad filter keeps
    the matches of a top list deep enough to hold ``limit`` of them at that rate (deepened when it did not);
    a selective one, or one whose list would cost more than that, restricts the query to its rows."""
    matched = int(np.count_nonzero(rows))
    if not matched:
        return []
    pool = int(1.5 * limit * len(rows) / matched) + 1
    while widens(pool, matched):
        hits = searcher.search(query, pool, count=False).hits
        rids = searcher.fast_field_values("rid", [address for _, address in hits])  # no stored document read
        kept = [
            hit
            for hit, rid in zip(hits, rids, strict=True)
            if rid is not None and rid < len(rows) and rows[rid]
        ]
        if len(hits) < pool or (len(kept) >= limit and hits[-1][0] < kept[limit - 1][0]):
            return _best_kept(searcher, kept, limit)
        if not kept:
            break
        # Too few matches at this depth, or hits past it may tie with the last one kept.
        pool = max(2 * pool, int(1.5 * limit * len(hits) / len(kept)) + 1)
    rids = np.flatnonzero(rows).tolist()
    return _top(searcher, _restricted(query, "rid", rids), limit)[0]


def _best_kept(
    searcher: tantivy.Searcher, kept: list[tuple[float, tantivy.DocAddress]], limit: int
) -> list[tuple[str, float]]:
    """The best ``limit`` of a widened list's matches, ties in doc_id order as ``_top`` cuts them: every kept
    hit tied with the last one kept is read before the cut (the caller saw none past the list)."""
    if not kept:
        return []
    last = kept[min(limit, len(kept)) - 1][0]
    ranked = sorted(
        (-float(score), searcher.doc(address)["doc_id"][0]) for score, address in kept if score >= last
    )
    return [(doc_id, -score) for score, doc_id in ranked[:limit]]
