"""The demo corpus shipped with the app reads as the addresses were written: no passage holds the Latin-1
reading of a Big5 punctuation pair ("America\u00a1\u00a6s"), which a search result would show as is."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from app.demo.build_corpus import BIG5_PUNCTUATION, decode

CORPUS = Path(__file__).resolve().parents[2] / "app" / "demo" / "corpus.jsonl.gz"
# A Big5 lead byte 0xA1 and a trail byte (0x40-0x7E or 0xA1-0xFE), each read as a Latin-1 character; and the
# Latin-1 reading of a UTF-8 sequence ("\u00c3\u00a9" for an e acute), the other common mojibake.
MOJIBAKE = re.compile("\u00a1[\u0040-\u007e\u00a1-\u00fe]|[\u00c2\u00c3][\u0080-\u00bf]")


def test_no_demo_passage_holds_mojibake() -> None:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as handle:
        passages = [json.loads(line) for line in handle]
    spoiled = [(p["id"], match[0]) for p in passages if (match := MOJIBAKE.search(p["text"]))]
    assert len(passages) > 2000
    assert spoiled == [], f"{len(spoiled)} passages, first {spoiled[:3]}"


def test_each_big5_pair_is_written_as_its_cp950_character() -> None:
    """The table's ASCII stands for the character cp950 reads (the ideographic space drops: an indent)."""
    ascii_of = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2014": "--", "\u2026": "..."}
    for pair, written in BIG5_PUNCTUATION.items():
        character = pair.decode("cp950")
        assert written == ("" if character == "\u3000" else ascii_of[character]), pair
    raw = b"America\xa1\xa6s\n\xa1@Now \xa1\xa7\xa1Kwe\xa1\xa8\xa1Xthey Bruneti\xe8re, \xbd\xa2"
    assert decode(raw) == 'America\'s\nNow "...we"--they Bruneti\u00e8re, \u00bd\u00a2'
