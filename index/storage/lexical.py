"""In-memory BM25 over a version's documents: the unfiltered BM25 path, far faster than FTS5's ``bm25()``.

FTS5 ranks an OR query by calling ``bm25()`` on every matching row (SciFact claims match a third of the
corpus, so that was most of a hybrid search's CPU under load: docs/design-decisions.md, and
benchmarks/results/search_latency.json for what is served now). Here each term's postings are flat arrays
and a query is a few vectorised gathers. SQLite stays the source of truth: the index is built from the
store in a background thread (FTS5 answers until it is ready) and follows the store through the same
changelog that keeps FAISS current. A filter reaches it as a mask over the store's document rows
(``index.storage.columns``).

Scoring is Okapi BM25 with FTS5's constants (k1 1.2, b 0.75) over Snowball-stemmed words; deleted or
replaced documents leave dead slots, skipped at query time and compacted by a rebuild past half the slots.
"""

from __future__ import annotations

import json
import logging
import threading
from array import array
from collections import Counter
from dataclasses import dataclass

import numpy as np
import Stemmer

from index.storage.store import DocumentStore
from index.text.analysis import MAX_QUERY_TERMS, STOPWORDS, query_terms, words

log = logging.getLogger(__name__)
K1, B = 1.2, 0.75
_STEMMER_LOCK = threading.Lock()  # a PyStemmer object is not thread-safe


@dataclass
class Pending:
    """Documents changed in the changelog's ``(since, through]``: each as (rid, text), or None when deleted.
    ``through`` None: the changelog was pruned past ``since``, the index is read again."""

    since: int
    through: int | None
    documents: list[tuple[str, tuple[int, str] | None]]


class LexicalIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stemmer = Stemmer.Stemmer("english")
        self._stems: dict[str, str] = {}
        self._builder: threading.Thread | None = None
        self._stopped = threading.Event()
        self._reset()

    def _reset(self) -> None:
        self.ready = False
        self.seq = 0
        self._postings: dict[str, tuple[array, array]] = {}  # stem -> (slots, term frequencies)
        self._slot_of: dict[str, int] = {}
        self._doc_ids: list[str] = []
        self._rows = array(
            "q"
        )  # each slot's document row in the store (its rid): how a filter's mask applies
        self._lengths = array("f")
        self._alive = array("b")
        self._alive_count = 0
        self._alive_length = 0.0

    # ---- building and following the store ------------------------------------------------------------

    def start(self, store: DocumentStore) -> threading.Thread | None:
        """Build in the background; queries use FTS5 until ``ready``."""
        if self._stopped.is_set():
            return None
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
        """End a background build before the store closes: closing a SQLite connection under a running
        query crashes the process, not just the thread."""
        self._stopped.set()
        # A finishing build may hand over to a fresh one (sync -> start) while we wait: join until none runs.
        while (builder := self._builder) is not None and builder is not threading.current_thread():
            builder.join()
            if self._builder is builder:
                return

    def build(self, store: DocumentStore) -> None:
        if self._stopped.is_set():
            return
        try:
            with self._lock:
                self._reset()
                self.seq = store.max_seq()  # before reading: later changes are replayed (idempotent)
                for rid, document in store.iter_rows():
                    if self._stopped.is_set():
                        return
                    self._add(document.id, document.text, rid)
                self.ready = True
            self.sync(store)
            log.info("in-memory BM25 ready: %d documents, %d terms", self._alive_count, len(self._postings))
        except Exception:  # the store went away (version swapped, closed): FTS5 keeps answering
            log.warning("in-memory BM25 not built; BM25 stays on FTS5", exc_info=True)

    def sync(self, store: DocumentStore) -> int:
        """Apply changelog entries past ``seq``: each changed document is re-read as it is now."""
        with store.snapshot():
            pending = self.pending(store)
        return self.apply(pending, store)

    def pending(self, store: DocumentStore) -> Pending | None:
        """The documents changed past ``seq``, as the store holds them: read without the lock (in the caller's
        snapshot of the store), so that ``apply`` holds it (and the index its write lock) only to apply them."""
        since = self.seq
        if not self.ready or self._stopped.is_set():  # a running build replays the changelog when it ends
            return None
        if since < store.pruned_through():  # entries we needed are gone: read everything again
            return Pending(since, None, [])
        changes = store.changes_since(since)
        if not changes:
            return None
        doc_ids = list(dict.fromkeys(doc_id for _, doc_id, _, _ in changes))
        rows = store.query(
            "SELECT id, rid, text FROM documents WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(doc_ids),),
        )
        found = {doc_id: (rid, text) for doc_id, rid, text in rows}
        return Pending(since, changes[-1][0], [(doc_id, found.get(doc_id)) for doc_id in doc_ids])

    def apply(self, pending: Pending | None, store: DocumentStore) -> int:
        """``pending`` into the postings, unless a build or another sync has moved ``seq`` since it was read (that
        one read the store later; ``seq`` then tells searches the postings are not at the columns' point)."""
        if pending is None:
            return 0
        with self._lock:
            if not self.ready or self.seq != pending.since:
                return 0
            if pending.through is None:
                self.start(store)
                return 0
            for doc_id, row in pending.documents:
                self._remove(doc_id)
                if row is not None:
                    self._add(doc_id, row[1], row[0])
            self.seq = pending.through
            rebuild = len(self._doc_ids) > 1000 and self._alive_count < len(self._doc_ids) // 2
        if rebuild:
            self.start(store)
        return len(pending.documents)

    def _stem(self, terms: list[str]) -> list[str]:
        """Indexing: every word of the corpus is cached (the vocabulary grows with the documents)."""
        unknown = [w for w in set(terms) if w not in self._stems]
        if unknown:
            with _STEMMER_LOCK:
                self._stems.update(zip(unknown, self._stemmer.stemWords(unknown), strict=True))
        return [self._stems[w] for w in terms]

    def _stem_query(self, terms: list[str]) -> list[str]:
        """Queries: corpus words from the indexing cache, any other word stemmed and forgotten, so random
        query words cannot grow memory (300 random-word queries kept 85 MB for the life of a version)."""
        stems = self._stems
        unknown = [w for w in set(terms) if w not in stems]
        fresh: dict[str, str] = {}
        if unknown:
            with _STEMMER_LOCK:
                fresh = dict(zip(unknown, self._stemmer.stemWords(unknown), strict=True))
        return [stems.get(w) or fresh[w] for w in terms]

    def _add(self, doc_id: str, text: str, row: int) -> None:
        tokens = words(text)
        slot = len(self._doc_ids)
        self._doc_ids.append(doc_id)
        self._rows.append(row)
        self._slot_of[doc_id] = slot
        self._lengths.append(len(tokens))
        self._alive.append(1)
        self._alive_count += 1
        self._alive_length += len(tokens)
        indexed = [w for w in tokens if w not in STOPWORDS]  # never query terms (see query_terms)
        for stem, count in Counter(self._stem(indexed)).items():
            slots, frequencies = self._postings.setdefault(stem, (array("i"), array("f")))
            slots.append(slot)
            frequencies.append(count)

    def _remove(self, doc_id: str) -> None:
        slot = self._slot_of.pop(doc_id, None)
        if slot is not None and self._alive[slot]:
            self._alive[slot] = 0
            self._alive_count -= 1
            self._alive_length -= self._lengths[slot]

    @property
    def documents(self) -> int:
        """Documents held (deleted ones not counted)."""
        return self._alive_count

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
        those documents (the same scores, since the collection statistics stay those of every document, as
        FTS5's are). ``at``: None unless the postings are at that changelog point (the caller's other copies')."""
        terms = list(dict.fromkeys(query_terms(text)))[:MAX_QUERY_TERMS]  # the terms FTS5 would get
        stems = list(dict.fromkeys(self._stem_query(terms)))
        with self._lock:
            if at is not None and (self.seq != at or not self.ready):
                return None
            if not self._alive_count or limit <= 0:
                return []
            # Copies, never np.frombuffer views: a view exports the array's buffer for as long as it lives
            # (past the lock when the frame outlives it, as a traceback keeps it), and while it does every
            # append of a write fails with BufferError, half-applied (a soak run hit it).
            alive = np.array(self._alive, np.int8)
            lengths = np.array(self._lengths, np.float32)
            norm_scale = K1 * B / (self._alive_length / self._alive_count)
            scores = np.zeros(len(self._doc_ids), np.float32)
            for stem in stems:
                if stem not in self._postings:
                    continue
                slots, frequencies = (np.array(a, a.typecode) for a in self._postings[stem])
                live = alive[slots].astype(bool)
                slots, tf = slots[live], frequencies[live]
                df = len(slots)
                idf = np.log(1.0 + (self._alive_count - df + 0.5) / (df + 0.5))
                norm = K1 * (1 - B) + norm_scale * lengths[slots]
                scores[slots] += idf * tf * (K1 + 1) / (tf + norm)
            if only is not None:
                allowed = np.zeros(len(scores), bool)
                slot_of = self._slot_of
                allowed[[slot_of[d] for d in only if d in slot_of]] = True
                scores[~allowed] = 0
            if rows is not None:
                slot_rows = np.array(self._rows, np.int64)
                inside = slot_rows < len(rows)  # a document newer than the mask is not in it
                scores[~inside] = 0
                scores[inside] *= rows[slot_rows[inside]]
            matched = np.flatnonzero(scores)
            if len(matched) > limit:
                matched = matched[np.argpartition(-scores[matched], limit - 1)[:limit]]
            best = matched[np.argsort(-scores[matched], kind="stable")]
            return [(self._doc_ids[slot], float(scores[slot])) for slot in best]
