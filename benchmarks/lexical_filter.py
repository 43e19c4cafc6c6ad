"""Filtered BM25 two ways on one real index (issue 68's open point), side by side in one process: the columns'
bitmap handed to tantivy (today's ``LexicalIndex.search(rows=mask)``: a widened top list or the query
restricted to the mask's rids) against the filter inside tantivy (a prototype index with each document's
metadata in a JSON fast field, the filter tree translated into tantivy queries, searched as Must(text) +
Must(const-score filter)). The bitmap path before (widened lists read each hit's stored rid) and now (rids read
from tantivy's fast field in one call), its restriction forced, and a widened list forced (fast rids) beside
them; each index's build CPU from the store (the write path's share: the prototype's metadata costs there).

Same store, same 100 query sentences (``filtered_search``'s), filters of 0.1%, 1%, 10% and 50% as equality,
range and ``$or``; per query the searching thread's CPU time and wall time, p50 / p99; the mask's own cost (the
columns' pass, which the bitmap path pays and the inside path does not) apart; and whether each plan's top 10
(ids and scores, ties cut in doc_id order) equals the bitmap path's.

    nice -n 10 .venv/bin/python benchmarks/lexical_filter.py --index-dir /work/bench/real100k \
        --work /work/bench/tfilter-100k --out benchmarks/results/lexical_filter.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import tantivy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.index_scale import split_sentences  # noqa: E402
from harness.provenance import command, load_average  # noqa: E402
from index.storage import lexical  # noqa: E402
from index.storage.columns import Columns  # noqa: E402
from index.storage.filters import (  # noqa: E402
    All,
    Either,
    Equals,
    Exists,
    Filter,
    Not,
    Range,
    iso_instant,
    julianday,
    parse_filter,
)
from index.storage.lexical import LexicalIndex, query_stems  # noqa: E402
from index.storage.store import DocumentStore  # noqa: E402

FILTERS = {
    "0.1% eq": {"bucket": 7},
    "0.1% $or/$not": {"$or": [{"bucket": 7}, {"bucket": 8}], "$not": {"date": {"$lt": "2021-05-15"}}},
    "1% eq": {"bucket": {"$in": list(range(10))}},
    "1% range": {"bucket": {"$lt": 10}},
    "1% $or": {"$or": [{"bucket": {"$lt": 5}}, {"bucket": {"$gte": 995}}]},
    "10% eq": {"bucket": {"$in": list(range(100))}},
    "10% range": {"bucket": {"$lt": 100}},
    "10% $or/$not": {"$not": {"bucket": {"$gte": 100}}},
    "50% date range": {"date": {"$gte": "2021-05-15"}},
    "50% $or": {"$or": [{"bucket": {"$lt": 250}}, {"bucket": {"$gte": 750}}]},
}
LIMIT = 10


# ---- the prototype: metadata inside tantivy -------------------------------------------------------------


def proto_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_integer_field("rid", stored=True, indexed=True, fast=True)
    builder.add_integer_field("length", fast=True)
    builder.add_text_field("stems", stored=False, tokenizer_name="whitespace", index_option="freq")
    # typed elements by kind: n numbers (f64), t texts, d date-shaped texts' julianday, b booleans
    builder.add_json_field("meta", stored=False, fast=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("fields", stored=False, tokenizer_name="raw", index_option="basic")
    return builder.build()


PROTO = proto_schema()


def meta_object(metadata: dict) -> tuple[dict, list[str]]:
    kinds: dict[str, dict[str, list]] = {"n": {}, "t": {}, "d": {}, "b": {}}
    for name, value in metadata.items():
        for element in value if isinstance(value, list) else [value]:
            if isinstance(element, bool):
                kinds["b"].setdefault(name, []).append(element)
            elif isinstance(element, int | float):
                kinds["n"].setdefault(name, []).append(float(element))
            elif isinstance(element, str):
                kinds["t"].setdefault(name, []).append(element)
                if iso_instant(element) and (day := julianday(element)) is not None:
                    kinds["d"].setdefault(name, []).append(day)
    return {k: v for k, v in kinds.items() if v}, list(metadata)


def build_proto(store: DocumentStore, folder: Path) -> tantivy.Index:
    if (folder / "meta.json").exists():
        return tantivy.Index.open(str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    index = tantivy.Index(PROTO, path=str(folder))
    writer = index.writer(lexical.WRITER_HEAP, 1)
    for rid, document in store.iter_rows():
        terms = lexical.indexed_terms(document.text)
        doc = tantivy.Document()
        doc.add_text("doc_id", document.id)
        doc.add_integer("rid", rid)
        doc.add_integer("length", terms.count(" ") + 1 if terms else 0)
        doc.add_text("stems", terms)
        meta, names = meta_object(document.metadata)
        doc.add_json("meta", meta)
        for name in names:
            doc.add_text("fields", name)
        writer.add_document(doc)
    writer.commit()
    writer.wait_merging_threads()
    return index


class Translator:
    def __init__(self, index: tantivy.Index):
        self.index = index

    def query(self, node: Filter) -> tantivy.Query:
        Q, Occur = tantivy.Query, tantivy.Occur
        if isinstance(node, All):
            if not node.parts:
                return Q.all_query()
            return Q.boolean_query([(Occur.Must, self.query(p)) for p in node.parts])
        if isinstance(node, Either):
            return Q.boolean_query([(Occur.Should, self.query(p)) for p in node.parts])
        if isinstance(node, Not):
            return Q.boolean_query([(Occur.Must, Q.all_query()), (Occur.MustNot, self.query(node.part))])
        if isinstance(node, Exists):
            return Q.term_query(PROTO, "fields", node.field)
        if isinstance(node, Equals):
            parts = [
                Q.term_set_query(PROTO, f"meta.{kind}.{node.field}", values)
                for kind, values in (
                    ("n", [float(v) for v in node.numbers]),
                    ("t", list(node.texts)),
                    ("d", list(node.days)),
                    ("b", list(node.flags)),
                )
                if values
            ]
            return Q.boolean_query([(Occur.Should, p) for p in parts]) if parts else Q.empty_query()
        assert isinstance(node, Range)
        if node.bound is None:
            return Q.empty_query()
        kind = "d" if node.on_dates else "n"
        return self.index.parse_query(f"meta.{kind}.{node.field}:{node.sign}{float(node.bound)!r}", [])


def inside(searcher, translator: Translator, text: str, tree: Filter) -> list[tuple[str, float]]:
    text_query = lexical._any_of(query_stems(text))
    restricted = tantivy.Query.boolean_query(
        [
            (tantivy.Occur.Must, text_query),
            (tantivy.Occur.Must, tantivy.Query.const_score_query(translator.query(tree), 0.0)),
        ]
    )
    return lexical._top(searcher, restricted, LIMIT)[0]


# ---- the bitmap path with rids read from the fast field ------------------------------------------------


def widened_fast(searcher, text: str, rows: np.ndarray) -> list[tuple[str, float]]:
    """A top list deep enough for ``LIMIT`` matches at the mask's rate, rids read in one fast-field call; the
    kept hits tied with the last one all read before the cut (``_top``'s rule)."""
    query = lexical._any_of(query_stems(text))
    matched = int(np.count_nonzero(rows))
    if not matched:
        return []
    pool = int(1.5 * LIMIT * len(rows) / matched) + 1
    while True:
        hits = searcher.search(query, pool, count=False).hits
        rids = searcher.fast_field_values("rid", [address for _, address in hits])
        kept = [hit for hit, rid in zip(hits, rids, strict=True) if rid < len(rows) and rows[rid]]
        exhausted = len(hits) < pool
        if len(kept) >= LIMIT:
            last = kept[LIMIT - 1][0]
            if exhausted or hits[-1][0] < last:
                break
            pool *= 2  # hits past the list may tie with the last kept one
        elif exhausted:
            break
        else:
            pool = max(2 * pool, int(1.5 * LIMIT * len(hits) / max(len(kept), 1)) + 1)
    if not kept:
        return []
    last = kept[min(LIMIT, len(kept)) - 1][0]
    ranked = sorted((-float(s), searcher.doc(a)["doc_id"][0]) for s, a in kept if s >= last)
    return [(doc_id, -score) for score, doc_id in ranked[:LIMIT]]


def before(bitmap: LexicalIndex, text: str, rows: np.ndarray) -> list[tuple[str, float]]:
    """The bitmap path before this benchmark (its parent commit): widened lists read each hit's stored rid."""
    searcher, query = bitmap._view.searcher, lexical._any_of(query_stems(text))
    matched = int(np.count_nonzero(rows))
    pool = int(1.5 * LIMIT * len(rows) / matched) + 1
    while pool * 0.005 <= 5.0 + matched * 0.0016:
        hits, rids = lexical._top(searcher, query, pool)
        kept = [hit for hit, rid in zip(hits, rids, strict=True) if rid < len(rows) and rows[rid]]
        if len(kept) >= LIMIT or len(hits) < pool:
            return kept[:LIMIT]
        if not kept:
            break
        pool = int(1.5 * LIMIT * len(hits) / len(kept)) + 1
    rids = np.flatnonzero(rows).tolist()
    return lexical._top(searcher, lexical._restricted(query, "rid", rids), LIMIT)[0]


def restricted(bitmap: LexicalIndex, text: str, rows: np.ndarray) -> list[tuple[str, float]]:
    """The product's restricted plan forced: a term set of the mask's rids."""
    saved, lexical.widens = lexical.widens, lambda pool, matched: False
    try:
        return bitmap.search(text, LIMIT, rows=rows)
    finally:
        lexical.widens = saved


# ---- measuring -----------------------------------------------------------------------------------------


def timed(run):
    wall, cpu = time.perf_counter(), time.thread_time()
    result = run()
    return 1000 * (time.perf_counter() - wall), 1000 * (time.thread_time() - cpu), result


def percentiles(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.percentile(values, 50)), 3),
        "p99_ms": round(float(np.percentile(values, 99)), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", type=Path, required=True, help="filtered_search's real index folder")
    parser.add_argument("--work", type=Path, required=True, help="where both tantivy indexes are built")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/lexical_filter.json")
    args = parser.parse_args()
    versions = sorted((args.index_dir / "index/versions").iterdir())
    store = DocumentStore(versions[-1] / "store.sqlite", create=False, read_only=True)
    columns = Columns.load(store)
    started = time.process_time()
    bitmap = LexicalIndex(args.work / "lexical")
    if bitmap.start(store) is not None:
        bitmap.wait()
    build_bitmap_cpu = time.process_time() - started
    started = time.process_time()
    proto = build_proto(store, args.work / "proto")
    build_proto_cpu = time.process_time() - started
    proto.reload()
    proto_searcher = proto.searcher()
    translator = Translator(proto)
    texts = split_sentences(random.Random(0))[0][: args.queries]
    plans = {
        "mask": lambda t, tree, rows: columns.select(tree).documents,
        "bitmap_before": lambda t, tree, rows: before(bitmap, t, rows),
        "bitmap": lambda t, tree, rows: bitmap.search(t, LIMIT, rows=rows),
        "bitmap_restrict": lambda t, tree, rows: restricted(bitmap, t, rows),
        "bitmap_fast_widen": lambda t, tree, rows: widened_fast(bitmap._view.searcher, t, rows),
        "inside": lambda t, tree, rows: inside(proto_searcher, translator, t, tree),
    }
    rows_out = []
    for label, raw in FILTERS.items():
        tree = parse_filter(raw)
        mask = columns.select(tree).documents
        times = {plan: ([], []) for plan in plans}
        same = {plan: 0 for plan in plans if plan not in ("mask", "bitmap")}
        for i, text in enumerate(texts):
            answers = {}
            order = list(plans) if i % 2 == 0 else list(reversed(plans))
            for plan in order:
                wall, cpu, answers[plan] = timed(lambda p=plan, t=text, f=tree, m=mask: plans[p](t, f, m))
                times[plan][0].append(wall)
                times[plan][1].append(cpu)
            for plan in same:
                same[plan] += _rounded(answers[plan]) == _rounded(answers["bitmap"])
        row = {"filter": label, "json": raw, "matching": round(float(mask.mean()), 4)}
        for plan, (walls, cpus) in times.items():
            row[plan] = {"cpu": percentiles(cpus), "wall": percentiles(walls)}
        row["top10_identical_to_bitmap"] = {plan: f"{n}/{len(texts)}" for plan, n in same.items()}
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    unfiltered = [timed(lambda t=t: bitmap.search(t, LIMIT))[1] for t in texts]
    result = {
        "command": command(),
        "load_average": load_average(),
        "documents": store.counts()["documents"],
        "queries": len(texts),
        "build_cpu_s": {"bitmap_index": round(build_bitmap_cpu, 1), "proto_index": round(build_proto_cpu, 1)},
        "disk_bytes": {"bitmap_index": bitmap.disk_bytes(), "proto_index": _bytes(args.work / "proto")},
        "unfiltered_cpu": percentiles(unfiltered),
        "rows": rows_out,
        "note": "ms per query (the searching thread's CPU; wall beside it). mask: the columns' pass that the "
        "bitmap plans need first (not in their figures); bitmap_before: LexicalIndex.search(rows=mask) before this "
        "change (widened top list reading each hit's stored rid, or a term_set restriction on rid); bitmap: as in the "
        "product now (widened list with rids from the fast field, or the restriction); bitmap_restrict: its restriction forced; bitmap_fast_widen: always a widened list, rids read "
        "by Searcher.fast_field_values; inside: a prototype index with the metadata in a JSON fast field, the "
        "tree translated, Must(text) + Must(const_score(filter)).",
    }
    bitmap.stop()
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def _rounded(hits: list[tuple[str, float]]) -> list[tuple[str, float]]:
    return [(doc_id, round(score, 4)) for doc_id, score in hits]


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


if __name__ == "__main__":
    main()
