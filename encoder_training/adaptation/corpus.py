"""The user's corpus as passages, and the training pairs it makes by itself (no labels).

Three kinds of pair, after the papers that introduced them:

- ``ict`` (Inverse Cloze Task, ORQA; Lee et al. 2019): a sentence of a passage against the rest of that
  passage; the sentence is left in with probability ``keep_sentence`` so the encoder still rewards
  lexical overlap (ORQA keeps it 10% of the time).
- ``title``: a document's title against its body, where documents have titles.
- ``crop`` (independent cropping, Contriever; Izacard et al. 2021): two random spans of one passage.

Every passage gives at most one pair per round, its kind drawn at random: two pairs of one document in
one batch would make each other's positive a false in-batch negative.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from index.build.ingest import iter_documents
from index.records import Document
from index.storage import layout
from index.storage.store import DocumentStore

PAIR_KINDS = ("ict", "title", "crop")
# A sentence ends at . ! or ? followed by space and an upper-case letter, digit or bracket.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")
MIN_SENTENCE_WORDS = 5


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    body: str

    @property
    def text(self) -> str:
        """What the index embeds for this document (``index.build.ingest`` puts the title in front the same way)."""
        return f"{self.title}\n\n{self.body}" if self.title and self.body else (self.title or self.body)


def is_index_folder(path: Path) -> bool:
    return path.is_dir() and layout.current_version(path) is not None


def read_passages(source: str | Path, limit: int | None = None) -> list[Passage]:
    """Documents of a corpus file / folder (``index.build.ingest`` formats) or of an existing index folder."""
    path = Path(source)
    documents = _index_documents(path) if is_index_folder(path) else iter_documents(path)
    passages = []
    for document in documents:
        passage = to_passage(document)
        if passage.body or passage.title:
            passages.append(passage)
        if limit and len(passages) >= limit:
            break
    if not passages:
        raise ValueError(f"no text in {source}")
    return passages


def _index_documents(root: Path) -> Iterator[Document]:
    version = layout.current_version(root)
    assert version is not None
    store = DocumentStore(layout.version_dir(root, version) / layout.STORE, create=False, read_only=True)
    try:
        yield from store.iter_documents()
    finally:
        store.close()


def to_passage(document: Document) -> Passage:
    """Split an ingested document back into title and body (ingest joined them with a blank line)."""
    title = str(document.metadata.get("title") or "").strip()
    text = document.text.strip()
    body = text[len(title) :].strip() if title and text.startswith(title) else text
    return Passage(document.id, title, " ".join(body.split()))


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def ict_pair(passage: Passage, rng: random.Random, keep_sentence: float) -> dict[str, str] | None:
    """One sentence (of at least ``MIN_SENTENCE_WORDS`` words) vs. the title and the other sentences."""
    sentences = split_sentences(passage.body)
    if len(sentences) < 3:
        return None
    choices = [i for i, s in enumerate(sentences) if len(s.split()) >= MIN_SENTENCE_WORDS]
    if not choices:
        return None
    chosen = rng.choice(choices)
    rest = sentences if rng.random() < keep_sentence else sentences[:chosen] + sentences[chosen + 1 :]
    body = " ".join(rest)
    positive = f"{passage.title}\n\n{body}" if passage.title else body
    return {"anchor": sentences[chosen], "positive": positive}


def title_pair(passage: Passage) -> dict[str, str] | None:
    if not passage.title or len(passage.body.split()) < MIN_SENTENCE_WORDS:
        return None
    return {"anchor": passage.title, "positive": passage.body}


def crop_pair(
    passage: Passage, rng: random.Random, low: float = 0.1, high: float = 0.5
) -> dict[str, str] | None:
    """Two independent random spans, each ``low``..``high`` of the passage's words (Contriever's ratios)."""
    words = passage.text.split()
    if len(words) < 2 * MIN_SENTENCE_WORDS:
        return None

    def crop() -> str:
        size = max(MIN_SENTENCE_WORDS, int(len(words) * rng.uniform(low, high)))
        start = rng.randrange(0, len(words) - size + 1)
        return " ".join(words[start : start + size])

    return {"anchor": crop(), "positive": crop()}


def make_pairs(
    passages: list[Passage],
    kinds: tuple[str, ...] | list[str] = ("ict",),
    rounds: int = 1,
    keep_sentence: float = 0.1,
    seed: int = 42,
) -> list[dict[str, str]]:
    """``rounds`` passes over the passages, at most one pair per passage per round, in a shuffled order."""
    unknown = set(kinds) - set(PAIR_KINDS)
    if unknown or not kinds:
        raise ValueError(f"pair kinds must be among {', '.join(PAIR_KINDS)}, not {sorted(unknown) or 'none'}")
    rng = random.Random(seed)
    pairs: list[dict[str, str]] = []
    for _ in range(rounds):
        batch = []
        for passage in passages:
            kind = rng.choice(list(kinds))
            if kind == "ict":
                pair = ict_pair(passage, rng, keep_sentence)
            elif kind == "title":
                pair = title_pair(passage) or ict_pair(passage, rng, keep_sentence)
            else:
                pair = crop_pair(passage, rng)
            if pair and pair["anchor"] != pair["positive"]:
                batch.append(pair)
        rng.shuffle(batch)
        pairs += batch
    return pairs
