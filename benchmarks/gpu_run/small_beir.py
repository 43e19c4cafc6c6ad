"""A small BEIR folder cut from a large one, for the GPU runs' CPU dry runs: the judged documents of the
first queries of each split, then other documents up to ``--documents``, and only the queries whose judged
documents all made it in. Standard library only.

    python benchmarks/gpu_run/small_beir.py ../shared/data/beir-scifact runs/scifact-small --documents 120
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    judged: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines()[1:]:
        query, document, score = line.split("\t")
        judged.setdefault(query, {})[document] = int(score)
    return judged


def small_beir(source: Path, out: Path, documents: int) -> dict[str, int]:
    splits = {path.stem: read_qrels(path) for path in sorted((source / "qrels").glob("*.tsv"))}
    keep: dict[str, None] = {}
    for judged in splits.values():  # each split's first queries' documents, a third of the room each
        for docs in list(judged.values())[: max(1, documents // (3 * len(splits)))]:
            keep.update(dict.fromkeys(docs))
    with gzip.open(source / "corpus.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line in handle]
    for row in rows:
        if len(keep) >= documents:
            break
        keep.setdefault(row["_id"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with gzip.open(out / "corpus.jsonl.gz", "wt") as handle:
        for row in rows:
            if row["_id"] in keep:
                handle.write(json.dumps(row) + "\n")
    kept_queries: set[str] = set()
    counts = {"documents": len(keep)}
    for split, judged in splits.items():
        lines = ["query-id\tcorpus-id\tscore"]
        for query, docs in judged.items():
            if all(doc in keep for doc in docs):
                kept_queries.add(query)
                lines += [f"{query}\t{doc}\t{score}" for doc, score in docs.items()]
        (out / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
        counts[f"{split}_queries"] = sum(1 for q in judged if q in kept_queries)
    with (source / "queries.jsonl").open() as handle, (out / "queries.jsonl").open("w") as written:
        for line in handle:
            if json.loads(line)["_id"] in kept_queries:
                written.write(line)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--documents", type=int, default=120)
    args = parser.parse_args()
    print(json.dumps(small_beir(args.source, args.out, args.documents)))


if __name__ == "__main__":
    main()
