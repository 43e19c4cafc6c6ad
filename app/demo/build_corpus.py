"""Maintainer script: how ``corpus.jsonl.gz`` (the demo corpus shipped with the app) was made.

Source: US presidential inaugural (1789-2005) and State of the Union (1945-2006) addresses, US-government
works in the public domain (NLTK corpora; ../shared/data/english-prose-public-domain). Each address is cut
into passages of about ``WORDS`` words on paragraph boundaries, with metadata that filters can use.

    python -m app.demo.build_corpus ../shared/data/english-prose-public-domain app/demo/corpus.jsonl.gz
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

WORDS = 120
KINDS = {"inaugural": "Inaugural Address", "state_union": "State of the Union"}
# Five addresses (2005 Bush, 1971-1974 Nixon) hold typographic punctuation as Big5/cp950 double bytes (lead byte
# 0xA1) in otherwise Latin-1 files: read as Latin-1 they showed "America\u00a1\u00a6s". Each pair found in
# the sources, by its cp950 character, written as the rest of the corpus writes it (plain ASCII, "--" dashes).
BIG5_PUNCTUATION = {
    b"\xa1@": "",  # U+3000 ideographic space, an indent before a paragraph
    b"\xa1K": "...",  # U+2026 horizontal ellipsis
    b"\xa1X": "--",  # U+2014 em dash
    b"\xa1\xa5": "'",  # U+2018 left single quotation mark
    b"\xa1\xa6": "'",  # U+2019 right single quotation mark (the apostrophe of "America's")
    b"\xa1\xa7": '"',  # U+201C left double quotation mark
    b"\xa1\xa8": '"',  # U+201D right double quotation mark
}
BIG5_PAIR = re.compile(b"|".join(re.escape(pair) for pair in BIG5_PUNCTUATION))


def passages(text: str, words: int = WORDS) -> Iterator[str]:
    current: list[str] = []
    for paragraph in (p.strip() for p in text.splitlines()):
        if not paragraph:
            continue
        current.append(paragraph)
        if sum(len(p.split()) for p in current) >= words:
            yield " ".join(current)
            current = []
    if current:
        yield " ".join(current)


def decode(raw: bytes) -> str:
    """Latin-1 (a few Gutenberg and address files hold accents and "\u00bd\u00a2"), except the Big5
    punctuation pairs, which Latin-1 would turn into two symbols each."""
    return BIG5_PAIR.sub(lambda pair: BIG5_PUNCTUATION[pair[0]].encode("latin-1"), raw).decode("latin-1")


def records(source: Path) -> Iterator[dict]:
    for folder, title in KINDS.items():
        for path in sorted((source / folder).glob("*.txt.gz")):
            match = re.match(r"(\d{4})-(.+)\.txt\.gz", path.name)
            if not match:
                continue
            year, president = int(match[1]), match[2].split("-")[0]
            text = decode(gzip.decompress(path.read_bytes()))
            for number, passage in enumerate(passages(text)):
                yield {  # the file stem keeps two addresses of one year apart (1965-Johnson-1, -2)
                    "id": f"{path.name[: -len('.txt.gz')].lower()}-{folder}-{number:03d}",
                    "text": passage,
                    "president": president,
                    "year": year,
                    "title": f"{title} {year} ({president})",
                    "kind": folder,
                }


def main(source: str, out: str) -> None:
    with gzip.open(out, "wt", encoding="utf-8") as handle:
        count = sum(handle.write(json.dumps(record) + "\n") > 0 for record in records(Path(source)))
    print(f"{count} passages -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
