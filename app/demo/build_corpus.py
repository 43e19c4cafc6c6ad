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


def records(source: Path) -> Iterator[dict]:
    for folder, title in KINDS.items():
        for path in sorted((source / folder).glob("*.txt.gz")):
            match = re.match(r"(\d{4})-(.+)\.txt\.gz", path.name)
            if not match:
                continue
            year, president = int(match[1]), match[2].split("-")[0]
            text = gzip.decompress(path.read_bytes()).decode("latin-1")
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
