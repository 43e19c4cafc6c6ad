"""Readers that turn the shared sentence-pair sets (and a user's own JSONL / TSV) into training rows.

Every reader returns a list of dicts with the column names the sentence-transformers losses read
positionally: ``anchor, positive`` (pairs), ``anchor, positive, negative`` (triples),
``sentence1, sentence2, score`` (cosine loss, score in 0..1) or ``premise, hypothesis, label``
(softmax loss). Files are read as they are distributed; no preprocessing step is needed.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

Row = dict[str, str | float | int]
NLI_LABELS = {"entailment": 0, "neutral": 1, "contradiction": 2}
SNLI_FILES = ("snli-dev-test/snli_1.0_dev.jsonl.gz", "snli-dev-test/snli_1.0_test.jsonl.gz")


def _open_text(path: Path):
    return (
        gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8-sig")
    )


def _tsv_rows(path: Path) -> Iterator[list[str]]:
    """TAB only, no CSV quoting: these sets have bare ``"`` inside sentences."""
    with _open_text(path) as handle:
        yield from csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)


def _jsonl(path: Path) -> Iterator[dict]:
    with _open_text(path) as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _take(rows: Iterable[Row], limit: int | None) -> list[Row]:
    return list(itertools.islice(rows, limit))


def _snli_records(data: Path) -> Iterator[dict]:
    for name in SNLI_FILES:
        for record in _jsonl(data / name):
            if record["gold_label"] in NLI_LABELS:
                yield record


def snli_pairs(data: Path, limit: int | None = None) -> list[Row]:
    """Premise / entailed-hypothesis pairs: positives for in-batch-negative losses."""
    rows = (
        {"anchor": r["sentence1"], "positive": r["sentence2"]}
        for r in _snli_records(data)
        if r["gold_label"] == "entailment"
    )
    return _take(rows, limit)


def snli_triplets(data: Path, limit: int | None = None) -> list[Row]:
    """(premise, entailment, contradiction) per caption: the contradiction is a hard negative (SBERT NLI recipe)."""
    by_premise: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for record in _snli_records(data):
        by_premise[record["sentence1"]][record["gold_label"]].append(record["sentence2"])

    def triplets() -> Iterator[Row]:
        for premise, labelled in by_premise.items():
            for positive, negative in zip(labelled["entailment"], labelled["contradiction"], strict=False):
                yield {"anchor": premise, "positive": positive, "negative": negative}

    return _take(triplets(), limit)


def snli_labelled(data: Path, limit: int | None = None) -> list[Row]:
    """Three-way NLI labels for the softmax loss of the original SBERT paper."""
    rows = (
        {"premise": r["sentence1"], "hypothesis": r["sentence2"], "label": NLI_LABELS[r["gold_label"]]}
        for r in _snli_records(data)
    )
    return _take(rows, limit)


def coco_pairs(data: Path, limit: int | None = None) -> list[Row]:
    """Consecutive captions of one image as paraphrase pairs (each caption is an anchor once)."""
    with gzip.open(
        data / "coco-captions-val2017" / "captions_val2017.json.gz", "rt", encoding="utf-8"
    ) as handle:
        annotations = json.load(handle)["annotations"]
    by_image: dict[int, list[str]] = defaultdict(list)
    for annotation in annotations:
        by_image[annotation["image_id"]].append(annotation["caption"].strip())
    rows = (
        {"anchor": first, "positive": second}
        for captions in by_image.values()
        for first, second in zip(captions, captions[1:], strict=False)
    )
    return _take(rows, limit)


def msrp_pairs(data: Path, limit: int | None = None) -> list[Row]:
    """Positive MSRP pairs of the train split only: STS-B asks not to train on the MSRP test split."""
    rows = (
        {"anchor": fields[3], "positive": fields[4]}
        for fields in itertools.islice(_tsv_rows(data / "msr-paraphrase" / "msr-para-train.tsv"), 1, None)
        if len(fields) >= 5 and fields[0] == "1"
    )
    return _take(rows, limit)


def stsb_rows(data: Path, split: str = "train", limit: int | None = None) -> list[Row]:
    """STS-B ``split`` with the 0-5 gold score scaled to 0-1, the range the cosine loss regresses to."""
    rows = (
        {"sentence1": fields[5], "sentence2": fields[6], "score": float(fields[4]) / 5.0}
        for fields in _tsv_rows(data / "stsbenchmark" / f"sts-{split}.csv")
        if len(fields) >= 7
    )
    return _take(rows, limit)


def file_rows(path: Path, columns: list[str] | None = None, limit: int | None = None) -> list[Row]:
    """A user's JSONL (objects) or TSV (header line) of pairs or triples, keeping ``columns`` in order.

    Without ``columns`` a JSONL keeps every key and a TSV every header column; a column named
    ``score`` or ``label`` is converted to a number.
    """
    if path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
        records: Iterable[dict] = _jsonl(path)
    else:
        lines = _tsv_rows(path)
        header = next(lines)
        records = (dict(zip(header, fields, strict=False)) for fields in lines if len(fields) >= len(header))
    rows = (_select(record, columns) for record in records)
    return _take(rows, limit)


def _select(record: dict, columns: list[str] | None) -> Row:
    names = columns or list(record)
    missing = [name for name in names if name not in record]
    if missing:
        raise ValueError(f"pairs file row lacks column(s) {missing}: {sorted(record)}")
    row: Row = {}
    for name in names:
        value = record[name]
        row[name] = float(value) if name == "score" else int(value) if name == "label" else str(value)
    return row


NAMED_SETS = {
    "snli": snli_pairs,
    "snli-triplets": snli_triplets,
    "snli-labelled": snli_labelled,
    "coco": coco_pairs,
    "msrp": msrp_pairs,
    "stsb-train": lambda data, limit=None: stsb_rows(data, "train", limit),
}


def load_training_rows(
    source: str, data_dir: Path, columns: list[str] | None = None, limit: int | None = None
) -> list[Row]:
    """``source`` is a named shared set (see ``NAMED_SETS``) or a path to a JSONL / TSV file."""
    if source in NAMED_SETS:
        return NAMED_SETS[source](data_dir, limit)
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"pairs {source!r}: neither a named set ({', '.join(NAMED_SETS)}) nor a file")
    return file_rows(path, columns, limit)
