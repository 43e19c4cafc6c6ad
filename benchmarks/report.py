"""Render docs/benchmarks.md (and its plots) from the JSON files in benchmarks/results/, and nothing else.

Each benchmark writes one result file; this page is what they say, one section per question a user asks,
each figure with the command that reruns it. Edit this script, not the page:

    python benchmarks/report.py            # rewrite docs/benchmarks.md and the PNGs it shows
    python benchmarks/report.py --check    # exit 1 if docs/benchmarks.md is not what the results render

``--check`` compares the page byte for byte and draws no plot (tests/test_benchmark_report.py runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def num(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def ran(command: str, *files: str) -> str:
    return f"`{command}` -> " + ", ".join(f"`{name}`" for name in files)


def missing(name: str, command: str) -> str:
    return f"Not run yet: `{command}` writes `benchmarks/results/{name}`."


class Page:
    """The page's sections and the summary rows they contribute, in order."""

    def __init__(self) -> None:
        self.summary: list[list[str]] = []
        self.sections: list[str] = []
        self.plots: dict[str, object] = {}  # file name -> a function that draws it

    def section(self, title: str, *parts: str) -> None:
        self.sections.append("\n\n".join([f"## {title}", *[prose(part) for part in parts if part]]))


def prose(part: str) -> str:
    """A paragraph wrapped at 110 columns; tables, images and anything laid out already are left as they are."""
    if "\n" in part or part.startswith(("|", "!", "```")):
        return part
    return textwrap.fill(part, 110, break_long_words=False, break_on_hyphens=False)


# ---------------------------------------------------------------------------------------------------------


def embedding_throughput(page: Page) -> None:
    name, default = "embed_throughput.json", "python benchmarks/embed_throughput.py"
    data = load(name)
    if data is None:
        page.section("Embedding throughput by backend", missing(name, default))
        return
    command = data.get("command", default)
    offline = {k: v for k, v in data["rows"].items() if "callers" not in k}
    callers = {k: v for k, v in data["rows"].items() if "callers" in k}
    best = max(offline.items(), key=lambda item: item[1]["sentences_per_s"])
    page.summary.append(
        [
            "embedding throughput by backend (offline, batch 32)",
            f"{best[0]}: {num(best[1]['sentences_per_s'])} sentences/s, "
            f"{best[1]['x_baseline']:.2f}x sentence-transformers",
            ran(command, name),
        ]
    )
    ratios = data.get("ratios", {})
    page.plots["embed_throughput.png"] = lambda path: bar_chart(
        path,
        {k: v["sentences_per_s"] for k, v in offline.items()},
        "sentences/s",
        f"Embedding throughput, {data['sentences']:,} sentences, {data['machine']['cpus']} CPU cores",
    )
    page.section(
        "Embedding throughput by backend",
        f"How many sentences a second each backend embeds in-process: {data['sentences']:,} real sentences "
        f"(STS-B and SciFact, {data['mean_words']:.1f} words on average), the bundled all-MiniLM-L6-v2, "
        f"{data['machine']['cpus']} CPU cores. Cosine is to sentence-transformers' own vectors.",
        table(
            ["backend", "sentences/s", "x sentence-transformers", "mean cosine", "min cosine"],
            [
                [
                    backend,
                    num(row["sentences_per_s"]),
                    f"{row['x_baseline']:.2f}",
                    num(row.get("cosine_mean"), 4),
                    num(row.get("cosine_min"), 4),
                ]
                for backend, row in offline.items()
            ],
        ),
        "![sentences/s by backend](../benchmarks/results/embed_throughput.png)",
        "Through the micro-batcher, 64 concurrent callers of one sentence each (in-process, no HTTP):",
        table(
            ["arm", "sentences/s", "x sentence-transformers"],
            [[arm, num(row["sentences_per_s"]), f"{row['x_baseline']:.2f}"] for arm, row in callers.items()],
        ),
        (
            f"Micro-batched int8 runs at {ratios['microbatched_vs_offline_int8']:.2f}x its offline rate and "
            f"{ratios['microbatched_vs_one_per_pass_int8']:.2f}x one request a pass; torch at "
            f"{ratios['microbatched_vs_offline_torch']:.2f}x and {ratios['microbatched_vs_one_per_pass_torch']:.2f}x."
            if {"microbatched_vs_offline_int8", "microbatched_vs_offline_torch"} <= ratios.keys()
            else ""
        ),
        f"Command: {ran(command, name)}",
    )


def served_vs_offline(page: Page) -> None:
    name, default = "http_throughput.json", "python benchmarks/http_throughput.py --seconds 20"
    data = load(name)
    if data is None:
        page.section("Served against offline", missing(name, default))
        return
    command = data.get("command", default)
    http = data["http"]
    rows = []
    for route, arm in http.items():
        rows.append(
            [
                f"`{route}`",
                arm["connections"],
                num(arm["requests_per_s"]),
                num(arm.get("in_process_sentences_per_s")),
                num(arm.get("ratio_to_in_process"), 2),
                num(arm["p50_ms"], 1),
                num(arm["p99_ms"], 1),
                arm.get("errors_total", sum(arm["errors"].values())),
            ]
        )
    embed = http.get("/embed", {})
    page.summary.append(
        [
            "served against offline (one sentence a request, 64 connections)",
            f"`POST /embed` {num(embed.get('requests_per_s'))} req/s = "
            f"{num(embed.get('ratio_to_in_process'), 2)}x the in-process rate, p99 {num(embed.get('p99_ms'))} ms",
            ran(command, name),
        ]
    )
    page.section(
        "Served against offline",
        f"What HTTP costs: a real `cloze serve` ({data['backend']}) loaded by `wrk` on loopback, one text a "
        f"request, against the same runtime in-process on the same {data['sentences']:,} distinct sentences, "
        "both arms in one run (the in-process arm runs before and after each HTTP arm; its mean is the "
        f"reference). {data['load_generator']}; server at {data.get('server_checkout', '?').split()[0]}; load "
        f"{data['load_at_start']} at the start, {data['load_at_end']} at the end "
        f"({data['machine']['cpus']} cores: above that, other work shared the CPU). `/search` is hybrid, "
        "top 10, SciFact's queries. Needs `apt-get install wrk`.",
        table(
            [
                "route",
                "connections",
                "req/s",
                "in-process sentences/s",
                "ratio",
                "p50 ms",
                "p99 ms",
                "errors",
            ],
            rows,
        ),
        f"Command: {ran(command, name)}",
    )


def search_latency(page: Page) -> None:
    name, default = "search_latency.json", "python benchmarks/search_latency.py"
    data = load(name)
    if data is None:
        page.section("Search latency", missing(name, default))
        return
    command = data.get("command", default)
    rows = data["rows"]
    columns: list[str] = []
    for row in rows:  # every field any row has, in the order they first appear
        columns += [key for key in row if key not in columns]
    hybrid = [row for row in rows if row.get("mode") == "hybrid"]
    if hybrid:
        first, last = hybrid[0], hybrid[-1]
        page.summary.append(
            [
                f"search latency, SciFact ({data['documents']:,} documents), hybrid",
                f"p50 {first['p50_ms']:.1f} ms at c={first['concurrency']}; "
                f"p99 {last['p99_ms']:.0f} ms at c={last['concurrency']}",
                ran(command, name),
            ]
        )

    def cell(value: object) -> str:
        return num(value, 1) if isinstance(value, float) else str(value)

    page.section(
        "Search latency",
        f"`POST /search` on a real server over the SciFact index ({data['documents']:,} documents, "
        f"{data['backend']}), SciFact's queries, an httpx client on the same cores. The figures are one "
        "machine's on one day: the 2-core machines differ several-fold in speed from one session to the next, "
        "so compare only figures measured side by side.",
        table(
            [key.replace("_ms", " ms").replace("_", " ") for key in columns],
            [[cell(row.get(key, "")) for key in columns] for row in rows],
        ),
        f"Command: {ran(command, name)}",
    )


def search_during_upsert(page: Page) -> None:
    name = "search_during_upsert.json"
    default = "python benchmarks/search_latency.py --during-upsert --label after"
    data = load(name)
    if data is None:
        page.section("Searches during a bulk upsert", missing(name, default))
        return
    rows = []
    for label, arm in data["arms"].items():
        alone, during, upsert = arm["search_alone"], arm["search_during_upsert"], arm["upsert"]
        rows.append(
            [
                label,
                arm["commit"],
                num(alone["p99_ms"]),
                num(during["p50_ms"]),
                num(during["p99_ms"]),
                num(upsert["docs_per_s"], 1),
                ", ".join(num(x, 1) for x in arm.get("load_average", [])),
            ]
        )
    workload = data["workload"]
    page.section(
        "Searches during a bulk upsert",
        f"{workload['searches']}; {workload['upserts']}; {workload['index']}. Upserts embed in the queries' "
        "batcher since issue 43, on all inference threads but one and at most one pass in "
        "`CLOZE_BULK_SHARE` while queries wait; before, they embedded beside it. Each pair ran back to back "
        f"on {workload['machine']}.",
        table(
            [
                "arm",
                "commit",
                "search alone p99 ms",
                "during p50 ms",
                "during p99 ms",
                "upsert docs/s",
                "load",
            ],
            rows,
        ),
        "Commands: " + "; ".join(f"`{arm['command']}`" for arm in data["arms"].values()) + f" -> `{name}`",
    )


def retrieval_quality(page: Page) -> None:
    rows, found = [], []
    for mode in ("dense", "bm25", "hybrid"):
        for backend in ("torch", "onnx-int8"):
            name = f"index_scifact_{mode}_{backend}.json"
            data = load(name)
            if data is None:
                continue
            found.append(data)
            rows.append(
                [
                    mode,
                    backend,
                    num(data["ndcg@10"], 3),
                    num(data["recall@100"], 3),
                    num(data["mrr@10"], 3),
                    data["queries"],
                    f"`{name}`",
                ]
            )
    command = "cloze eval beir --data ../shared/data/beir-scifact --mode M --backend B"
    out = "--out benchmarks/results/index_scifact_M_B.json"
    if not found:
        page.section("Retrieval quality", f"Not run yet: `{command} {out}`.")
        return
    best = max(found, key=lambda data: data["ndcg@10"])
    page.summary.append(
        [
            "retrieval quality, SciFact test, bundled model",
            f"nDCG@10 {best['mode']} ({best['backend']}) {best['ndcg@10']:.3f}",
            f"`{command} {out}`",
        ]
    )
    page.section(
        "Retrieval quality",
        f"BEIR SciFact test ({found[0]['queries']} queries, {found[0]['documents']:,} documents, "
        f"{found[0]['chunks']:,} chunks), the bundled {found[0]['model_id']}, by retrieval mode and backend.",
        table(["mode", "backend", "nDCG@10", "Recall@100", "MRR@10", "queries", "result file"], rows),
        f"Command, per mode M and backend B: `{command} {out}`",
    )


def index_scale(page: Page) -> None:
    name, default = "index_scale.json", "python benchmarks/index_scale.py --passages 1000000"
    data = load(name)
    if data is None:
        page.section("Index build at scale", missing(name, default))
        return
    command = data.get("command", default)
    stages = data["stage_seconds"]
    page.summary.append(
        [
            f"index build, {data['passages']:,} passages, `{data['factory']}`",
            f"{data['build_seconds'] / 60:.1f} min ({num(data['passages_per_second'])} passages/s), "
            f"peak RSS {data['peak_rss_mb'] / 1000:.2f} GB",
            ran(command, name),
        ]
    )
    recall = [
        [key.replace(",", ", "), num(row["recall@10"], 3), num(row["ms_per_query"], 2)]
        for key, row in data["recall_vs_exact"].items()
    ]
    page.section(
        "Index build at scale",
        f"`cloze index` over {data['passages']:,} passages of {data['sentences_per_passage']} real prose "
        f"sentences ({data['mean_chunk_tokens']} tokens on average), {data['backend']}, "
        f"{data['cpu_count']} CPU cores.",
        table(
            ["figure", "value"],
            [
                ["build, in all", f"{data['build_seconds'] / 60:.1f} min"],
                *[[f"stage: {stage}", f"{seconds / 60:.1f} min"] for stage, seconds in stages.items()],
                ["passages/s", num(data["passages_per_second"])],
                ["embed stage against the offline rate", f"{data['embed_vs_offline']:.2f}x"],
                ["peak RSS, build", f"{num(data['peak_rss_mb'])} MB"],
                ["index on disk", f"{num(data['index_dir_mb'])} MB"],
                ["open with lexical index", f"{data['open_with_lexical_seconds']} s"],
            ],
        ),
        f"Recall@10 against exact search, {data['queries']:,} queries (rerank: exact re-scoring of the top):",
        table(["nprobe, rerank", "recall@10", "ms a query"], recall),
        f"Command: {ran(command, name)}",
    )


def filtered_search(page: Page) -> None:
    """The real corpus (``filtered_search.json``) and the synthetic one (``filtered_search_synthetic.json``), before
    (SQLite's plans) and after (the in-memory columns), measured in one run each."""
    parts: list[str] = []
    for name, label, default in (
        ("filtered_search.json", "real text", "python benchmarks/filtered_search.py real --passages 100000"),
        (
            "filtered_search_synthetic.json",
            "synthetic vectors",
            "python benchmarks/filtered_search.py synthetic",
        ),
    ):
        data = load(name)
        if data is None or "plan" not in data["rows"][0]:
            parts.append(missing(name, default))
            continue
        parts += filtered_corpus(page, data, name, label)
    page.section("Filtered search at scale", *parts)


def goals(after: list[dict], unfiltered: dict[str, float]) -> str:
    """How many rows of the columns' plan meet the goals: p50 and p99 within 1.2x, recall at least unfiltered."""
    fast = [r for r in after if max(r["p50_ratio"], r["p99_ratio"]) <= 1.2]
    recalled = [r for r in after if "recall@10" in r]
    kept = [r for r in recalled if r["recall@10"] >= unfiltered[r["factory"]]]
    slow = sorted({f"{r['factory']} {r['mode']} {r['filter'].split()[0]}" for r in after if r not in fast})
    return (
        f"Goals (p50 and p99 within 1.2x of unfiltered; recall@10 at least unfiltered): latency met by {len(fast)} of "
        f"{len(after)} rows after, recall by {len(kept)} of {len(recalled)}. Over 1.2x: {', '.join(slow) or 'none'}."
    )


def filtered_corpus(page: Page, data: dict, name: str, label: str) -> list[str]:
    rows, columns = data["rows"], data["columns"]
    by_plan = {(r["factory"], r["mode"], r["filter"], r["plan"]): r for r in rows}
    after = [r for r in rows if r["plan"] == "after"]
    worst = max(after, key=lambda r: r["p99_ratio"])
    documents = columns["documents"]
    page.summary.append(
        [
            f"filtered search, {documents:,} documents ({label}), filters matching 0.1-90%",
            f"worst filtered/unfiltered p99 {worst['p99_ratio']:.2f}x after (columns) ({worst['factory']}, "
            f"{worst['filter']}, {worst['mode']})",
            ran(data["command"], name),
        ]
    )

    def ratio(row: dict | None) -> str:
        return "" if row is None else f"{row['p50_ratio']:.2f} / {row['p99_ratio']:.2f}"

    table_rows = []
    for row in after:
        before = by_plan.get((row["factory"], row["mode"], row["filter"], "before"))
        table_rows.append(
            [
                row["factory"],
                row["mode"],
                row["filter"],
                f"{row['matching']:.2%}",
                f"{row['unfiltered']['p50_ms']:.2f}",
                ratio(before),
                ratio(row),
                num(before.get("recall@10"), 3) if before else "",
                num(row.get("recall@10"), 3),
            ]
        )
    unfiltered = ", ".join(f"{k} {v:.3f}" for k, v in data["unfiltered_recall@10"].items())
    crossover = [
        [c["factory"], c["filter"], num(c["matching_chunks"]), c["exact_ms"], c["bitmap_ms"]]
        for c in data["crossover"]
    ]
    memory = (
        f"Columns in memory: {num(columns['array_bytes'] / 2**20, 1)} MB of arrays for {documents:,} documents and "
        f"{columns['fields']} fields ({columns['bytes_per_document']} bytes a document, "
        f"{columns['bytes_per_document_per_field']} a document and field, chunk map included); RSS grew "
        f"{num(columns['rss_growth_bytes'] / 2**20, 1)} MB while loading them again, in {columns['load_seconds']} s."
    )
    parts = [
        f"**{label.capitalize()}, {documents:,} documents.** `SearchIndex.search` in-process, top 10, filtered and "
        "unfiltered interleaved query by query; ratio = filtered / unfiltered p50 and p99; before = SQLite's plans "
        "(the side table and post-filtering), after = the in-memory columns, in the same run. Recall@10 against an "
        f"exact `IDMap2,Flat` search with the same filter; unfiltered recall@10 at the same settings: {unfiltered}. "
        f"Load average {data['load_average_start']} at the start, {data['load_average_end']} at the end: this "
        "machine was shared, so the ratios carry noise.",
        table(
            [
                "factory",
                "mode",
                "filter",
                "matching",
                "unfiltered p50 ms",
                "ratio before",
                "ratio after",
                "recall before",
                "recall after",
            ],
            table_rows,
        ),
        goals(after, data["unfiltered_recall@10"]),
        "Crossover (p50 ms of the two dense plans on the indexes that read vectors back):",
        table(["factory", "filter", "matching chunks", "exact", "bitmap"], crossover),
        memory,
    ]
    if writes := data.get("write_cost"):
        parts.append(
            "Write cost of keeping the columns (store-only writes, vectors given, best of alternated rounds): "
            + "; ".join(
                f"batches of {w['batch']}: {num(w['docs_per_second']['with_columns'])} documents/s with them, "
                f"{num(w['docs_per_second']['without'])} without ({w['slowdown']:.2f}x)"
                for w in writes.values()
            )
            + "."
        )
    if note := data.get("note"):
        parts.append(f"Note: {note}")
    parts.append(f"Command: {ran(data['command'], name)}")
    return parts


def model_memory(page: Page) -> None:
    name, default = "model_memory.json", "python benchmarks/model_memory.py"
    data = load(name)
    if data is None:
        page.section("Memory per model", missing(name, default))
        return
    command = data.get("command", default)
    rows = data["rows"]
    auto = [row for row in rows if row["backend"] == "auto"] or rows
    most = max(auto, key=lambda row: row["models"])
    per_model = most["warm_over_one_model_mib"] / max(1, most["models"] - 1)
    page.summary.append(
        [
            f"memory per named model (MiniLM, {most['served_backend']})",
            f"{num(auto[0]['rss_warm_mib'])} MiB with one model, about +{num(per_model)} MiB per extra model",
            ran(command, name),
        ]
    )
    table_rows = [
        [
            f"{row['backend']} ({row['served_backend']})",
            row["models"],
            num(row["rss_ready_mib"]),
            num(row["rss_warm_mib"]),
            num(row["peak_mib"]),
            f"+{num(row['warm_over_one_model_mib'])}",
            num(row["ready_s"]),
        ]
        for row in rows
    ]
    page.section(
        "Memory per model",
        f"Resident memory of `cloze serve` serving 1, 2 and 3 named embedding models (`CLOZE_MODELS`): {data['model']}, "
        f"the fill-mask model {data['fill_mask_model']}, an empty index. RSS is read from /proc when `/readyz` "
        f"says ready, then after a warm-up ({data['warm_up']}); the peak is VmHWM. Each model has its own "
        "weights, runtime, arena and batcher: memory grows by about one model's share for each model listed, "
        "whatever number of routes use it, so size a replica's memory limit (`CLOZE_API_MEMORY`) by the "
        f"models it serves. The machine was shared (load average {data['load_average_before'][0]} before, "
        f"{data['load_average_after'][0]} after, on 2 cores): the start times are slow, the memory is not "
        "affected.",
        table(
            [
                "backend",
                "models",
                "RSS at ready MiB",
                "RSS warm MiB",
                "peak MiB",
                "warm over 1 model",
                "ready after s",
            ],
            table_rows,
        ),
        f"Command: {ran(command, name)}",
    )


def collection_memory(page: Page) -> None:
    name, default = "collection_memory.json", "python benchmarks/collection_memory.py"
    data = load(name)
    if data is None:
        page.section("Memory per collection", missing(name, default))
        return
    command, rows = data.get("command", default), data["rows"]
    page.summary.append(
        [
            "memory per empty collection",
            f"{num(rows[1]['rss_mib'])} MiB with 1, {num(rows[-1]['rss_mib'])} MiB with {rows[-1]['collections']}: "
            f"about {data['per_collection_mib']} MiB each",
            ran(command, name),
        ]
    )
    table_rows = [
        [row["collections"], num(row["rss_mib"], 1), row.get("create_s", ""), row.get("after", "")]
        for row in rows
    ]
    page.section(
        "Memory per collection",
        f"Resident memory of one `cloze serve` ({data['model']}) holding 0, 1 and {rows[-1]['collections']} empty "
        "collections made by `POST /collections`, side by side in one run, then after one search in each (a "
        "search loads what a collection reads lazily). A collection holds an open SQLite store, an empty FAISS "
        "index and its chunker, never a copy of a model. `create s` is the mean time of one `POST /collections` "
        f"(load average {data['load_average_before'][0]} before, on 2 cores).",
        table(["collections", "RSS MiB", "create s", "after"], table_rows),
        f"Command: {ran(command, name)}",
    )


def snapshots(page: Page) -> None:
    name, default = "snapshot.json", "python benchmarks/snapshot.py --passages 100000"
    data = load(name)
    if data is None:
        page.section("Snapshots of a live collection", missing(name, default))
        return
    snap, alone, during = data["snapshot"], data["search_alone"], data["search_during_snapshot"]
    writes, upload = data["writes_during_snapshot"], data["restore_upload"]
    sizes = data["index_version_bytes"]
    mb = 2**20
    page.summary.append(
        [
            f"How long does a snapshot of {data['chunks']:,} chunks take, and what does it do to searches?",
            f"{snap['seconds']} s, {num(snap['bytes'] / mb)} MB; search p99 {num(alone['p99_ms'])} ms alone, "
            f"{num(during['p99_ms'])} ms during it",
            ran(data["command"], name),
        ]
    )
    rows = [
        [
            "index version on disk (store + FAISS)",
            f"{num(sizes['store.sqlite'] / mb)} + {num(sizes['vectors.faiss'] / mb)} MB",
        ],
        ["snapshot (`POST /collections/default/snapshots`, answered)", f"{snap['seconds']} s"],
        ["archive (uncompressed tar)", f"{num(snap['bytes'] / mb)} MB"],
        [
            f"dense `/search`, {data['search_clients']} clients, alone ({alone['requests']} requests)",
            f"p50 {num(alone['p50_ms'])} ms, p99 {num(alone['p99_ms'])} ms",
        ],
        [
            f"the same during the snapshot ({during['requests']} requests, {during['non_200']} not 200)",
            f"p50 {num(during['p50_ms'])} ms, p99 {num(during['p99_ms'])} ms, max {num(during['max_ms'])} ms",
        ],
        [
            f"upserts of 5 documents during the snapshot ({writes['requests']})",
            f"p50 {num(writes['p50_ms'])} ms, max {num(writes['max_ms'])} ms",
        ],
        [
            "restore offline into an empty folder (`cloze index restore --index`, a process)",
            f"{data['restore_offline_seconds']} s",
        ],
        [
            "restore by upload into the live service (`POST /collections/default/restore`)",
            f"{upload['seconds']} s",
        ],
    ]
    loads = data["load_average_before_and_after"]
    page.section(
        "Snapshots of a live collection",
        f"{data['passages']:,} passages ({data['chunks']:,} chunks, {data['factory']}, bundled MiniLM {data['backend']}) "
        "served by `cloze serve`; the searches alone and those during the snapshot were measured in the same run, "
        "one after the other, as was the write stream (one client, 5 documents every 0.5 s). Load average "
        f"{loads[0][0]} before, {loads[1][0]} after, on {data['cpu_count']} cores shared with other work.",
        table(["measure", "figure"], rows),
        f"Command: {ran(data['command'], name)}",
    )


def pretrain_speed(page: Page) -> None:
    name, default = "pretrain_throughput.json", "python benchmarks/pretrain_throughput.py --run-minutes 30"
    data = load(name)
    if data is None:
        page.section("Pre-training step speed", missing(name, default))
        return
    command = data.get("command", default)
    page.summary.append(
        [
            f"pre-training step, {data['recipe']}, {data['threads']} threads",
            f"MLM {data['mlm_speedup_vs_hf']:.2f}x Hugging Face's `BertForMaskedLM` step; "
            f"ELECTRA step {data['electra_over_mlm_step']:.2f}x the MLM step",
            ran(command, name),
        ]
    )
    labels = {
        "hf_baseline_mlm": "Hugging Face `BertForMaskedLM` + collator",
        "project_mlm": "this project's MLM",
        "project_mlm_bf16": "this project's MLM, bf16 autocast",
        "project_electra": "this project's ELECTRA",
    }
    rows = [
        [
            labels.get(key, key),
            num(data["median_step_s"][key], 3),
            num(tokens),
            num(data.get("median_page_faults_per_step", {}).get(key)),
        ]
        for key, tokens in data["tokens_per_s"].items()
    ]
    page.plots["pretrain_throughput.png"] = lambda path: bar_chart(
        path,
        {labels.get(k, k).replace("`", ""): v for k, v in data["tokens_per_s"].items()},
        "tokens/s",
        f"Pre-training step, {data['recipe']}, {data['tokens_per_step']:,} tokens a step",
    )
    timed = data.get("timed_run")
    page.section(
        "Pre-training step speed",
        f"The {data['recipe']} recipe, {data['tokens_per_step']:,} tokens a step, median of "
        f"{data['steps_timed']} interleaved steps each, {data['threads']} threads, on a heap that is never "
        "trimmed (`harness/heap.py`: glibc otherwise maps the baseline's logits afresh every step). To keep those "
        "page faults out of your own runs, preload jemalloc (Debian `libjemalloc2`):",
        "```\nLD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 \\\n"
        "  cloze train pretrain ...\n```",
        table(["step", "median s", "tokens/s", "page faults a step"], rows),
        "![tokens/s by contender](../benchmarks/results/pretrain_throughput.png)",
        (
            f"A {timed['minutes']:.0f}-minute MLM run on the shared prose and WikiText-2: {timed['steps']:,} "
            f"steps at {num(timed['tokens_per_s'])} tokens/s, held-out masked-token accuracy "
            f"{timed['heldout']['accuracy']:.3f} (loss {timed['heldout']['loss']:.2f}), peak memory "
            f"{timed['peak_rss_mb'] / 1000:.1f} GB.\n\n"
            "![loss curve](../benchmarks/results/pretrain_tiny_cpu_loss.png)"
            if timed
            else ""
        ),
        f"Command: {ran(command, name)}",
    )


def electra_vs_mlm(page: Page) -> None:
    name, default = "electra_vs_mlm.json", "python benchmarks/electra_vs_mlm.py"
    data = load(name)
    if data is None:
        page.section("ELECTRA against MLM", missing(name, default))
        return
    command = data.get("command", default)
    arms = data["electra_vs_mlm"]
    settings = data["settings"]
    rows = []
    for arm, row in arms.items():
        held = row.get("heldout", {})
        heldout = (
            f"discriminator AUC {held['discriminator_auc']:.3f}"
            if "discriminator_auc" in held
            else f"masked-token accuracy {held['accuracy']:.3f}"
            if "accuracy" in held
            else ""
        )
        rows.append(
            [
                arm,
                num(row.get("pretrain_steps", 0)),
                heldout,
                f"{row['stsb_test_spearman']:.3f} ({row['stsb_test_spearman_nli_only']:.3f})",
                f"{row['sick_r_spearman']:.3f}",
                f"{row['scifact_ndcg@10']:.3f}",
            ]
        )
    electra, mlm = arms.get("electra"), arms.get("mlm")
    if electra and mlm:
        page.summary.append(
            [
                f"ELECTRA against MLM, {settings['pretrain_minutes']:.0f} minutes of pre-training each",
                f"STS-B test {electra['stsb_test_spearman']:.3f} against {mlm['stsb_test_spearman']:.3f}; "
                f"SciFact nDCG@10 {electra['scifact_ndcg@10']:.3f} against {mlm['scifact_ndcg@10']:.3f}",
                ran(command, name),
            ]
        )
    regression = data.get("minilm_regression")
    page.section(
        "ELECTRA against MLM",
        f"Equal wall-clock: {settings['pretrain_minutes']:.0f} minutes of pre-training each "
        f"({settings['pretrain_overrides']}; peak learning rate MLM {settings['pretrain_learning_rate']['mlm']}, "
        f"ELECTRA {settings['pretrain_learning_rate']['electra']}), then the same fine-tuning "
        f"({settings['finetune']}); a randomly initialised encoder of the same shape, fine-tuned the same way, "
        f"is the floor. {data['machine']}.",
        table(
            [
                "encoder",
                "pre-train steps",
                "held-out",
                "STS-B test (NLI stage only)",
                "SICK-R",
                "SciFact nDCG@10",
            ],
            rows,
        ),
        "![ELECTRA against MLM](../benchmarks/results/electra_vs_mlm.png)",
        (
            f"The bundled all-MiniLM-L6-v2 on STS-B test: {regression['before']:.4f}, "
            f"{regression['after']:.4f} after {regression['steps']} more fine-tuning steps ({regression['recipe']})."
            if regression
            else ""
        ),
        f"Command: {ran(command, name)}",
    )


def adapt(page: Page) -> None:
    name, default = "adapt_test_60min.json", "python benchmarks/adapt.py --minutes 60 --split test --msmarco"
    data = load(name)
    if data is None:
        page.section("What `cloze adapt` buys", missing(name, default))
        return
    command = data.get("command", default)
    labels = {"both": "adapted (MLM + contrastive)", "mlm-only": "MLM stage only"}
    rows = []
    for run_name, run in (("adapt_test_60min.json", data), ("adapt_test.json", load("adapt_test.json"))):
        if run is None:
            continue
        for variant, row in run["scifact"].items():
            if variant == "bundled" and rows:
                continue  # the same model scored the same way in every run
            int8 = row.get("int8", {})
            msmarco = run.get("msmarco", {}).get(variant, {})
            rows.append(
                [
                    "bundled"
                    if variant == "bundled"
                    else f"{labels.get(variant, variant)}, {run['minutes']:.0f} min",
                    num(row["dense"], 4),
                    num(row["hybrid"], 4),
                    num(int8.get("dense"), 4),
                    num(int8.get("hybrid"), 4),
                    num(row.get("sts_b_test"), 4),
                    num(msmarco.get("dense"), 4),
                    f"`{run_name}`",
                ]
            )
    bundled, both = data["scifact"]["bundled"], data["scifact"].get("both", {})
    page.summary.append(
        [
            f"what `cloze adapt` buys, SciFact test, {data['minutes']:.0f} minutes",
            f"dense {bundled['dense']:.4f} -> {both.get('dense', 0):.4f}, "
            f"hybrid {bundled['hybrid']:.4f} -> {both.get('hybrid', 0):.4f}",
            ran(command, name),
        ]
    )
    train = load("adapt_scifact_train.json")
    train_rows = (
        [
            [label, num(train[key][mode]["ndcg@10"], 4), num(train[key][mode]["recall@100"], 4), mode]
            for key, label in (("bundled", "bundled"), ("adapted_30min", "adapted, 30 min"))
            for mode in ("dense", "hybrid")
        ]
        if train
        else []
    )
    page.section(
        "What `cloze adapt` buys",
        "`cloze adapt` on a corpus's own text (no labels: inverse-cloze pairs, an MLM stage, a contrastive "
        "stage, a forgetting guard), scored on SciFact test (nDCG@10) and on an MS MARCO subset the model "
        "already knows, where it must not lose more than 0.01. STS-B test checks it forgets little. "
        "Defaults were chosen on SciFact train; each choice is a line of "
        "[design-decisions.md](design-decisions.md).",
        table(
            [
                "model",
                "SciFact dense",
                "hybrid",
                "int8 dense",
                "int8 hybrid",
                "STS-B test",
                "MS MARCO dense",
                "result file",
            ],
            rows,
        ),
        (
            "SciFact train queries (809; the split defaults may be chosen on), `adapt_scifact_train.json`:\n\n"
            + table(["model", "nDCG@10", "Recall@100", "mode"], train_rows)
            if train_rows
            else ""
        ),
        f"Command: {ran(command, name)}",
    )


def adapt_check(page: Page) -> None:
    """``cloze adapt``'s result check on SciFact: what each run handed back, against what it trained."""
    name = "adapt_guard_test.json"
    default = (
        "python benchmarks/adapt.py --minutes 20 --variants both unguarded --modes dense --no-sts --no-int8"
    )
    data = load(name)
    if data is None:
        return
    labels = {
        "both": "`cloze adapt` (checked)",
        "unguarded": "the same run's blend, unchecked",
        "teacher": "`cloze adapt --teacher` (checked)",
    }
    rows = []
    for variant, row in data["scifact"].items():
        check = row.get("guard") or {}
        held = (
            f"{check['start']['decision']} -> {check['adapted']['decision']}" if check.get("decision") else ""
        )
        kept = f"{check['decision']} (weight {check['alpha']})" if check.get("decision") else ""
        rows.append([labels.get(variant, variant), num(row["dense"], 4), held, kept])
    bundled, both = data["scifact"]["bundled"]["dense"], data["scifact"].get("both", {})
    command = data.get("command", default)
    page.summary.append(
        [
            f"`cloze adapt` never hands back a worse encoder, SciFact test, {data['minutes']:.0f} minutes",
            f"dense {bundled:.4f} -> {both.get('dense', 0):.4f} ({(both.get('guard') or {}).get('decision')} kept)",
            ran(command, name),
        ]
    )
    page.section(
        "The adaptation check",
        "`cloze adapt` holds out pairs of the corpus it adapts to and keeps its result only if it beats the "
        "starting encoder on them (else the best blend that does, else the starting weights). Dense nDCG@10 "
        "on SciFact test beside the check's held-out score (start -> the configured blend) and what it kept; "
        f"{data['minutes']:.0f}-minute runs on the loaded 2-core machine. {data.get('note', '')}".strip(),
        table(["encoder", "SciFact test dense", "held-out check", "kept"], rows),
        f"Command: {ran(command, name)}",
    )


def fill_mask(page: Page) -> None:
    name, command = "fill_mask_all_layers.json", "python benchmarks/fill_mask_quality.py"
    data = load(name)
    if data is None:
        page.section("The default fill-mask model", missing(name, command))
        return
    suite, held, lama, lat = (data[k] for k in ("suite", "wikitext2_test_heldout", "lama", "latency"))
    after = lama["after"]
    page.summary.append(
        [
            "the default fill-mask model: plausibility suite, LAMA",
            f"top-1 accepted {suite['after']['top1_accepted']:.0%} (was {suite['before']['top1_accepted']:.0%}), "
            f"copied {suite['after']['top1_copied']:.0%}; T-REx P@1 {after['p@1']:.3f} (was "
            f"{lama['before']['p@1']:.3f})",
            ran(data["command"].split(" --")[0], name),
        ]
    )

    def row(label: str, pick, digits: int = 3) -> list[str]:
        return [label, *(num(pick(side), digits) for side in ("before", "after"))]

    rows = [
        row("suite: top-1 accepted", lambda s: suite[s]["top1_accepted"], 2),
        row("suite: top-5 accepted", lambda s: suite[s]["top5_accepted"], 2),
        row("suite: top-1 copied from the sentence", lambda s: suite[s]["top1_copied"], 2),
        row(
            "WikiText-2 test: accuracy, BERT token masking 15%",
            lambda s: held[s]["bert_token_15"]["accuracy"],
        ),
        row(
            "WikiText-2 test: accuracy, whole content words 40%",
            lambda s: held[s]["whole_word_content_40"]["accuracy"],
        ),
        row("LAMA T-REx P@1", lambda s: lama[s]["p@1"]),
        row("LAMA T-REx P@10", lambda s: lama[s]["p@10"]),
        row("LAMA Google-RE P@1", lambda s: lama[s]["google_re"]["p@1"]),
        row("LAMA SQuAD P@1", lambda s: lama[s]["squad"]["p@1"]),
        row("fill-mask call, median ms (interleaved)", lambda s: lat[s]["median_ms"], 1),
    ]
    training = data.get("training", {})
    page.section(
        "The default fill-mask model",
        f"Before: the previous default (top two layers and head trained, `pretrain_fill_mask.json`); after: "
        f"all six layers trained from it ({training.get('steps', '?')} steps). The plausibility suite is "
        f"`benchmarks/data/fill_mask_plausibility.json` ({suite['after']['sentences']} everyday sentences, "
        f"answers fixed before any model was scored); LAMA on ../shared/data/lama ({after['facts']:,} T-REx "
        "facts). The previous model was trained on WikiText-2 test too, so its held-out figures there are "
        "flattered; the new recipe never saw that split.",
        table(["measure", "before", "after"], rows),
        "![fill-mask training loss](../benchmarks/results/fill_mask_all_layers_loss.png)",
        f"Command: `{data['command']}` -> `{name}` (how it was trained: the delta's README).",
    )


def infinity(page: Page) -> None:
    name, default = "infinity_comparison.json", "python benchmarks/compare_infinity.py"
    data = load(name)
    if data is None:
        page.section(
            "Against Infinity and sentence-transformers",
            f"Not run yet: `{default}` writes `benchmarks/results/{name}`.",
        )
        return
    work = data["workload"]
    rows = [
        [
            row["engine"],
            row["backend"],
            num(row["seconds"], 1),
            num(row["sentences_per_s"]),
            num(row["tokens_per_s"]),
        ]
        for row in data["rows"]
    ]
    fastest = max(data["rows"], key=lambda row: row["sentences_per_s"])
    page.summary.append(
        [
            f"against Infinity, {work['requests']} requests of {work['sentences_per_request']} sentences",
            f"fastest: {fastest['engine']} ({fastest['backend']}) {num(fastest['sentences_per_s'])} sentences/s",
            ran(data["command"], name),
        ]
    )
    page.section(
        "Against Infinity and sentence-transformers",
        f"Infinity's benchmark workload, side by side in one run ({data['date']}): {work['requests']} requests "
        f"of {work['sentences_per_request']} sentences ({work['sentences']}).",
        table(["engine", "backend", "seconds", "sentences/s", "tokens/s"], rows),
        f"Command: {ran(data['command'], name)}",
    )


RELIABILITY = [
    ("fuzz.json", "python benchmarks/fuzz.py", "property-based requests against a real server: no 5xx"),
    ("soak.json", "python benchmarks/soak.py", "a long mixed load: no 5xx, memory flat"),
    (
        "crash_matrix.json",
        "python benchmarks/crash_matrix.py",
        "SIGKILL mid-write: no acknowledged write lost",
    ),
    (
        "hostile_input.json",
        "HOSTILE_RESULTS=benchmarks/results/hostile_input.json pytest tests/e2e/test_hostile_input.py",
        "oversized and hostile inputs: peak memory",
    ),
    ("deploy.json", "make test-deploy", "from `git clone` to a serving container"),
]


def reliability(page: Page) -> None:
    rows = []
    for name, default, question in RELIABILITY:
        data = load(name)
        if data is not None:
            recorded = data.get("command", "")
            command = recorded if recorded.startswith("python ") else default  # else: a note, not a command
            rows.append([question, f"`{command}`", f"`{name}`"])
    page.section(
        "Reliability runs",
        "What RELIABILITY.md quotes; each file holds its own figures.",
        table(["question", "command", "result file"], rows),
    )


GPU = """**Blocked: no GPU machine was lent for issue 49, so no GPU figure exists.** The code picks CUDA (torch fp16;
ONNX Runtime's CUDA provider when onnxruntime-gpu is installed) but has never run on one.
`benchmarks/gpu.py` is the one prepared run for when a machine is lent (one H200, 16 cores, Python 3.12 with
torch 2.11, transformers 5.17, sentence-transformers 6.0.1 and onnxruntime 1.30's CPU build; nothing can be
fetched there). In under 10 minutes it writes one JSON file with five parts, each guarded and under its own
time budget: the device `CLOZE_DEVICE=auto` picks and torch's dtype and ONNX Runtime's providers; in-process
sentences/s (torch fp16 on CUDA, ONNX int8 on the CPU cores, and a sweep of CUDA token budgets); `cloze serve`
under wrk against the same backend in-process, with p50/p99; the MLM step against `BertForMaskedLM`;
`cloze adapt` on SciFact for 4 minutes. Without CUDA it reports `"cuda": false` and skips the GPU parts
(`python benchmarks/gpu.py --quick`; `tests/test_gpu_benchmark.py`).

What the machine lacks travels with the call (at most 64 MiB with the tree): wheels for Python 3.12, the
data, wrk, and the bundled model at fp16. In the checkout the session was started in:

```
printf '/.whl/\\n/.gpu-carry/\\n/.gpu-model/\\n/.gpu-site/\\n' >> .git/info/exclude
python benchmarks/gpu.py --prepare .gpu-carry        # sentences, SciFact, WikiText-2 valid; .gpu-model/
python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \\
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \\
  faiss-cpu==1.15.1 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 pydantic==2.14.4 \\
  pydantic-core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4 typing-inspection==0.4.5 \\
  annotated-types==0.8.0 orjson==3.13.0 httptools==0.9.0 PyStemmer==3.1.0 datasets==5.2.0 dill==0.4.1 \\
  multiprocess==0.70.19                                  # 24.4 MB (23.2 MiB)
(cd /tmp && apt-get download wrk libluajit2-5.1-2 && dpkg -x wrk_*.deb wrk && dpkg -x libluajit2-*.deb wrk)
mkdir -p .gpu-carry/wrk && cp /tmp/wrk/usr/bin/wrk /tmp/wrk/usr/lib/x86_64-linux-gnu/libluajit-5.1.so.2* .gpu-carry/wrk/
```

Then on the GPU machine (the device tool; wrk also needs libssl 3, assumed present there):

| call | carry | command |
|---|---|---|
| 1 | `.whl` | `python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu-site .whl/*.whl` |
| 2, timeout 600 s | `.gpu-model`, `.gpu-carry` (48 MiB) | `export PYTHONPATH=$PWD/.gpu-site:$PWD/.gpu-model HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1; python3 benchmarks/gpu.py --sentences .gpu-carry/sentences.txt.gz --scifact .gpu-carry/beir-scifact --text .gpu-carry/wiki.valid.raw.gz --wrk .gpu-carry/wrk/wrk` |

It writes `$OUT/gpu.json`; copy it to `benchmarks/results/gpu.json`. If the second call finds a fresh machine,
parts 1, 2 and 4 still run and parts 3 and 5 record which packages were missing."""


def gpu(page: Page) -> None:
    data = load("gpu.json")
    if data is None:
        page.section("The GPU path (issue 49): prepared, not yet run", GPU)
        return
    page.section(
        "The GPU path (issue 49)",
        f"`benchmarks/results/gpu.json` holds a run (`{data.get('command', 'python benchmarks/gpu.py')}`; "
        f"CUDA: {data.get('cuda')}). How to run it again:",
        GPU.split("\n\n", 1)[1],
    )


# ---------------------------------------------------------------------------------------------------------


def bar_chart(path: Path, values: dict[str, float], unit: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(values)))
    names = list(values)[::-1]
    ax.barh(names, [values[name] for name in names], color="#4c72b0")
    for y, name in enumerate(names):
        ax.text(values[name], y, f" {values[name]:,.0f}", va="center", fontsize=9)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def rerank(page: Page) -> None:
    name, default = (
        "rerank.json",
        "python benchmarks/rerank.py --train-minutes 60 --model /work/rerank-models/scifact-minilm",
    )
    data = load(name)
    title = "What a trained reranker buys"
    if data is None:
        page.section(title, missing(name, default))
        return
    training = data["training"]
    recipe, dev = training["recipe"], training.get("dev", {})
    labels = {"scifact-dev": "SciFact train (dev)", "scifact": "SciFact test", "msmarco": "MS MARCO subset"}
    order = list(labels)
    weight = dev_blend_weight(data["rows"])
    rows = [
        [
            labels.get(row["dataset"], row["dataset"]),
            row["mode"],
            row["candidates"],
            row["backend"],
            num(row["first_stage"]["ndcg@10"], 4),
            num(row["reranked"]["ndcg@10"], 4),
            f"{row['paired_vs_first_stage']['ndcg@10']:+.4f} {row['paired_vs_first_stage']['ci95']}",
            num(row["blend_ndcg@10"][weight], 4) if weight and "blend_ndcg@10" in row else "",
            row["queries"],
        ]
        for row in sorted(
            data["rows"],
            key=lambda r: (order.index(r["dataset"]), r["mode"], r["candidates"], r["backend"]),
        )
    ]
    best = max(
        (r for r in data["rows"] if r["dataset"] == "scifact" and r["mode"] == "hybrid"),
        key=lambda r: (r["candidates"], r["backend"] == "torch"),
        default=None,
    )
    if best:
        page.summary.append(
            [
                f"what a reranker trained {training['train_seconds'] / 60:.0f} min on SciFact train buys",
                f"hybrid {best['first_stage']['ndcg@10']:.4f} -> {best['reranked']['ndcg@10']:.4f} "
                f"(top {best['candidates']} reranked, SciFact test nDCG@10)",
                ran(data["commands"][0], name),
            ]
        )
    page.section(
        title,
        "`cloze train reranker` on SciFact's train queries only (hard negatives mined by the service's hybrid "
        "search, guarded against unjudged positives), then the first stage's top N candidates of each test "
        "query reranked by the cross-encoder; nDCG@10 with the paired difference and its 95% bootstrap "
        "interval. MS MARCO is scored with the same model, which saw none of it. Settings were chosen on "
        "the train split (its dev check holds out train queries), never on test. `blend w`: the reranker's "
        "ranking and the first stage's fused by weighted reciprocal rank (w / (60 + reranker's rank) + (1 - w) "
        "/ (60 + first stage's rank)), w chosen on the dev rows (SciFact train queries held out from training).",
        f"Training: start `{Path(training['base_model']).name}`, loss `{recipe['loss']}`, "
        f"{recipe['num_negatives']} mined negatives a query, max length {recipe['max_length']}, "
        f"{training['data']['train_queries']} queries, {training['rows']} rows, {training['steps']} steps "
        f"({training['epochs']} epochs) in {training['train_seconds'] / 60:.1f} min of a "
        f"{recipe['max_time_minutes']:.0f}-minute budget"
        + (
            f", training loss {training['loss'][0]:.3f} -> {training['loss'][1]:.3f}"
            if "loss" in training
            else ""
        )
        + f"; dev ({dev.get('queries', 0)} held-out train "
        f"queries, top {dev.get('candidates', 0)}): {dev.get('first_stage_ndcg@10', '')} -> "
        f"{dev.get('reranked_ndcg@10', '')}. Negatives: {training['data']['mining']['negatives']} mined, "
        f"{training['data']['mining']['guarded']} skipped by the guard. First stage: the bundled encoder on "
        f"{data['rows'][0]['first_stage_backend'] if data['rows'] else ''}. Load average during the runs: "
        f"{min(data['load_average_1min_samples'])}-{max(data['load_average_1min_samples'])} on 2 cores."
        + (
            " **Under one epoch: these rows measure the pipeline, not the recipe** (a shared machine left the "
            "training minutes, not the hour the benchmark is meant to run)."
            if training["epochs"] < 1
            else ""
        ),
        table(
            [
                "data",
                "first stage",
                "candidates",
                "reranker backend",
                "first stage nDCG@10",
                "reranked",
                "difference [95% CI]",
                f"blend {weight} (chosen on dev)" if weight else "blend",
                "queries",
            ],
            rows,
        ),
        f"Command: {ran(' ; '.join(data['commands']), name)}",
        *rerank_latency(data.get("latency"), name),
    )


def dev_blend_weight(rows: list[dict]) -> str | None:
    """The reranker's weight in the rank blend that scored best on the held-out train queries (ties: the
    lighter weight), or None without a dev row."""
    dev = [r for r in rows if r["dataset"] == "scifact-dev" and "blend_ndcg@10" in r]
    if not dev:
        return None
    blend = max(dev, key=lambda r: r["candidates"])["blend_ndcg@10"]
    return max(blend, key=lambda w: (blend[w], -float(w)))


def rerank_latency(latency: dict | None, name: str) -> list[str]:
    """``/search`` with and without rerank under wrk, one server, side by side."""
    if not latency:
        return []
    backends = ", ".join(sorted({m.get("backend", "?") for m in latency["reranker"]}))
    rows = [
        [
            row["arm"],
            row["connections"],
            row["requests"],
            num(row["requests_per_s"], 1),
            num(row["p50_ms"], 0),
            num(row["p99_ms"], 0),
            row["errors_total"],
            row["load"][0],
        ]
        for row in latency["rows"]
    ]
    return [
        f'Latency of `POST /search` (SciFact, hybrid, top 10) without and with `rerank: {{"candidates": '
        f"{latency['candidates']}}}` (reranker on {backends}), one server, wrk for "
        f"{latency['seconds_per_setting']} s per row:",
        table(
            ["search", "connections", "requests", "requests/s", "p50 ms", "p99 ms", "errors", "load"], rows
        ),
        f"Command: {ran(latency['command'], name)}",
    ]


def render() -> Page:
    page = Page()
    for part in (
        embedding_throughput,
        served_vs_offline,
        search_latency,
        search_during_upsert,
        retrieval_quality,
        index_scale,
        filtered_search,
        model_memory,
        collection_memory,
        snapshots,
        pretrain_speed,
        electra_vs_mlm,
        adapt,
        adapt_check,
        rerank,
        fill_mask,
        infinity,
        reliability,
        gpu,
    ):
        part(page)
    return page


def text(page: Page) -> str:
    head = """# Benchmarks

Generated by `python benchmarks/report.py` from the JSON files in `benchmarks/results/`: edit the script, not
this page (`python benchmarks/report.py --check` tells whether the page is current). Each figure names the
command that reruns it and the result file it came from; unless a section says otherwise they were measured
on this project's 2-core CPU machine, both arms of a ratio side by side in one run. Experiments that chose a
default, and their figures, are in [design-decisions.md](design-decisions.md)."""
    summary = "## Summary\n\n" + table(["question", "figure", "command -> result file"], page.summary)
    return "\n\n".join([head, summary, *page.sections]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from what renders")
    args = parser.parse_args()
    page = render()
    rendered = text(page)
    if args.check:
        current = PAGE.read_bytes() if PAGE.is_file() else b""
        if current != rendered.encode():
            sys.exit(f"{PAGE.relative_to(ROOT)} is out of date: run python benchmarks/report.py")
        print(f"{PAGE.relative_to(ROOT)} is current")
        return
    PAGE.write_text(rendered)
    for name, draw in page.plots.items():
        draw(RESULTS / name)
    print(f"wrote {PAGE.relative_to(ROOT)} and {', '.join(page.plots)}")


if __name__ == "__main__":
    main()
