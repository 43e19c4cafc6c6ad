"""Rebuild the fill-mask pre-training corpus from text this machine can install, each source's licence recorded.

    apt-get install -y wordnet-base fortunes
    python -m encoder_training.pretraining.corpus --shared ../shared/data --out data/fill-mask-corpus

Writes one UTF-8 ``.txt`` per source (paragraphs separated by blank lines, the shape
``cloze train pretrain --input`` reads) and ``SOURCES.md`` with sizes and licences. Evaluation text is never
included: WikiText-2 *test* is the held-out set, and LAMA, SciFact, STS and MS MARCO stay out entirely.
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

WORDNET = Path("/usr/share/wordnet")
FORTUNES = Path("/usr/share/games/fortunes")
# Everyday prose and sayings; left out: quotes from in-copyright novels and TV (pratchett, startrek), song
# lyrics, ASCII art, and the ethnic / men-women jokes.
FORTUNE_FILES = (
    "wisdom people food pets kids education love work platitudes science miscellaneous sports medicine law "
    "literature humorists news politics magic goedel"
).split()


@dataclass(frozen=True)
class Source:
    name: str
    origin: str
    licence: str


SOURCES = {
    "wikitext2-valid": Source(
        "wikitext2-valid",
        "shared/data/wikitext-2-raw/wiki.valid.raw (the test split is the held-out set, never trained on)",
        "CC BY-SA 3.0 (Wikipedia text, Merity et al. 2016)",
    ),
    "gutenberg": Source(
        "gutenberg",
        "shared/data/english-prose-public-domain/gutenberg (13 Project Gutenberg books, NLTK selection)",
        "public domain in the USA",
    ),
    "presidential": Source(
        "presidential",
        "shared/data/english-prose-public-domain/state_union + inaugural",
        "public domain (US government works)",
    ),
    "wordnet": Source(
        "wordnet",
        "Debian package wordnet-base (/usr/share/wordnet/data.*): every synset's words, gloss and examples",
        "WordNet 3.0 licence (Princeton; permissive, BSD-like: use, copy, modify, distribute with notice)",
    ),
    "fortunes": Source(
        "fortunes",
        f"Debian package fortunes (/usr/share/games/fortunes: {', '.join(FORTUNE_FILES)})",
        "BSD fortune(6) data, distributed by Debian under the BSD licence (debian/copyright)",
    ),
}


def paragraphs_of(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return raw.decode("utf-8", errors="replace")


def wikitext(shared: Path) -> Iterator[str]:
    """WikiText-2 validation articles; the ``= Heading =`` lines are dropped, the prose kept."""
    for line in paragraphs_of(shared / "wikitext-2-raw" / "wiki.valid.raw").splitlines():
        line = line.strip()
        if line and not line.startswith("="):
            yield line


def prose(folders: Iterable[Path]) -> Iterator[str]:
    """Paragraphs of every ``*.txt.gz`` under the folders (Gutenberg headers were stripped by NLTK)."""
    for folder in folders:
        for path in sorted(folder.glob("*.txt.gz")):
            for paragraph in re.split(r"\n\s*\n", paragraphs_of(path)):
                paragraph = " ".join(paragraph.split())
                if len(paragraph) > 40:
                    yield paragraph


def wordnet_entry(line: str) -> str | None:
    """``dog, domestic dog: a member of the genus Canis ... . The dog barked all night.`` for one synset."""
    if line.startswith(" ") or "|" not in line:
        return None  # the licence header
    fields, gloss = line.split("|", 1)
    parts = fields.split()
    count = int(parts[3], 16)
    words = [re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in parts[4 : 4 + 2 * count : 2]]
    definition, *examples = [g.strip() for g in gloss.strip().split(";")]
    sentences = [e.strip('" ') for e in examples if e.startswith('"')]
    examples_text = " ".join(s[0].upper() + s[1:] + ("" if s[-1] in ".?!" else ".") for s in sentences if s)
    return f"{', '.join(words)}: {definition}. {examples_text}".strip()


def wordnet(root: Path = WORDNET) -> Iterator[str]:
    """Synsets in groups of eight to a paragraph, so packing is not one ``[SEP]`` per definition."""
    entries: list[str] = []
    for part in ("noun", "verb", "adj", "adv"):
        for line in (root / f"data.{part}").read_text(encoding="utf-8", errors="replace").splitlines():
            entry = wordnet_entry(line)
            if entry:
                entries.append(entry)
            if len(entries) == 8:
                yield " ".join(entries)
                entries = []
    if entries:
        yield " ".join(entries)


def fortunes(root: Path = FORTUNES) -> Iterator[str]:
    """One paragraph per fortune, attribution lines kept as text (``-- Victor Hugo``)."""
    for name in FORTUNE_FILES:
        path = root / name
        if not path.is_file():
            continue
        for cookie in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = " ".join(cookie.split())
            if len(text) > 20:
                yield text


def build(shared: Path, out: Path) -> dict[str, int]:
    """Write every source and ``SOURCES.md``; returns bytes per source."""
    out.mkdir(parents=True, exist_ok=True)
    prose_root = shared / "english-prose-public-domain"
    texts = {
        "wikitext2-valid": wikitext(shared),
        "gutenberg": prose([prose_root / "gutenberg"]),
        "presidential": prose([prose_root / "state_union", prose_root / "inaugural"]),
        "wordnet": wordnet(),
        "fortunes": fortunes(),
    }
    sizes = {}
    for name, paragraphs in texts.items():
        path = out / f"{name}.txt"
        path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
        sizes[name] = path.stat().st_size
    write_sources(out / "SOURCES.md", sizes)
    return sizes


def write_sources(path: Path, sizes: dict[str, int]) -> None:
    rows = [
        f"| {name}.txt | {sizes[name] / 1e6:.1f} MB | {SOURCES[name].origin} | {SOURCES[name].licence} |"
        for name in sizes
    ]
    path.write_text(
        "# Fill-mask pre-training corpus (built by encoder_training.pretraining.corpus)\n\n"
        "| file | size | from | licence |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
        "Not included, ever: WikiText-2 test (the held-out set), LAMA, SciFact, STS, MS MARCO.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shared", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("data/fill-mask-corpus"))
    args = parser.parse_args()
    for name, size in build(args.shared, args.out).items():
        print(f"{name}: {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
