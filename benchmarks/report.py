"""Render docs/benchmarks.md (and its plots) from the JSON files in benchmarks/results/, and nothing else.

Each benchmark writes one result file; this page is what they say, one section per question a user asks,
each figure with the command that reruns it. Edit this script and its template, not the page:

    python benchmarks/report.py            # rewrite docs/benchmarks.md and the PNGs it shows
    python benchmarks/report.py --check    # exit 1 if docs/benchmarks.md is not what the results render

``--check`` compares the page byte for byte and draws no plot (tests/test_benchmark_report.py runs it).

Each section is a function of its result registered with ``@section(title, result file, command)``, which
returns a ``Body``: its paragraphs and tables, the summary row it adds and the plots it draws. The words are
in benchmarks/report_template.md, a block per section named after its function: the function picks the
figures, builds the tables (``Table`` specs, a header and a cell function per column) and fills its block with
them (``fill``). ``Page.add`` does the rest for every section alike: load the result, say "not run yet" when
it is missing, add the summary row, close with the command that reruns it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
TEMPLATE = Path(__file__).with_name("report_template.md")
LAID_OUT = ("|", "!", "```")  # a table, an image, a fenced block: kept line for line, never wrapped


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def num(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


MACHINE_PATH = re.compile(r"(--[\w-]+)([ =])(/\S+)")  # an option given an absolute path
OLDER_CHECKOUT = {
    "--baseline-checkout",
    "--compare-layout",
    "--server-root",
    "--before",
}  # options naming a checkout


def portable(command: str) -> str:
    """A recorded command without the folders of the machine it ran on: an absolute path given to an option
    becomes a name for one of the reader's own (BEFORE for a checkout of an older commit, else the option's
    name in capitals), and a path inside a folder already named keeps its tail (``--model MODEL --onnx
    MODEL/onnx/rerank.onnx``). Relative paths are left as they are."""
    named: dict[str, str] = {}

    def rename(match: re.Match) -> str:
        option, separator, path = match.groups()
        for folder, name in named.items():
            if path.startswith(folder + "/"):
                return f"{option}{separator}{name}{path[len(folder) :]}"
        named[path] = "BEFORE" if option in OLDER_CHECKOUT else option[2:].upper().replace("-", "_")
        return f"{option}{separator}{named[path]}"

    return MACHINE_PATH.sub(rename, command)


def ran(command: str, *files: str) -> str:
    return f"`{portable(command)}` -> " + ", ".join(f"`{name}`" for name in files)


def prose(part: str) -> str:
    """A paragraph wrapped at 110 columns; tables, images and anything laid out already are left as they are."""
    if "\n" in part or part.startswith(LAID_OUT):
        return part
    return textwrap.fill(part, 110, break_long_words=False, break_on_hyphens=False)


# The template: the page's words in blocks, filled with figures, tables and commands.


def paragraphs(text: str) -> list[str]:
    """A block's paragraphs, split at blank lines (not in a fenced block): a prose paragraph's lines joined by
    spaces, for ``prose`` to wrap on the page; a table, image or fenced block kept line for line."""
    found: list[list[str]] = [[]]
    fenced = False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if line.strip() or fenced:
            found[-1].append(line)
        elif found[-1]:
            found.append([])
    return [
        "\n".join(lines) if lines[0].startswith(LAID_OUT) else " ".join(lines) for lines in found if lines
    ]


def read_template(path: Path = TEMPLATE) -> dict[str, list[str]]:
    """The template's blocks by name: each starts at a line ``<!-- name -->``; what comes before the first is
    the template's own note."""
    _, *named = re.split(r"^<!-- ([\w.]+) -->$", path.read_text(), flags=re.MULTILINE)
    return {name: paragraphs(text) for name, text in zip(named[::2], named[1::2], strict=True)}


BLOCKS = read_template()
FIELD = re.compile(r"\{(\w+)\}")


def fill(block: str, **values: Any) -> list[str]:
    """A block's paragraphs with ``values`` in its format fields. A paragraph that is one field holding a list
    (another block's paragraphs) becomes that list; one that fills to nothing is left out."""
    filled: list[str] = []
    for paragraph in BLOCKS[block]:
        if (whole := FIELD.fullmatch(paragraph)) and isinstance(values[whole[1]], list):
            filled += values[whole[1]]
        elif text := paragraph.format_map(values).strip():
            filled.append(text)
    return filled


def figures_of(result: dict, *keys: str) -> dict[str, Any]:
    """A result's figures under their own names, for a block's fields of the same names."""
    return {key: result[key] for key in keys}


def phrase(block: str, **values: Any) -> str:
    """A block of one paragraph, filled: a sentence or clause that goes inside another block's paragraph."""
    return " ".join(fill(block, **values))


def missing(name: str, command: str) -> str:
    return phrase("not_run", command=portable(command), result=name)


def closing(command: str, *files: str) -> list[str]:
    """The paragraph that ends a section: the command that reruns it and the result files it writes."""
    return fill("command", ran=ran(command, *files))


# Cells: a table's column is a header and a function of one row (a dict).

Cell = Callable[[dict], object]


def pick(row: dict, key: str | tuple[str, ...]) -> Any:
    for part in (key,) if isinstance(key, str) else key:
        row = row.get(part) if isinstance(row, dict) else None
    return row


def number(key: str | tuple[str, ...], digits: int = 0) -> Cell:
    return lambda row: num(pick(row, key), digits)


def fixed(key: str | tuple[str, ...], digits: int) -> Cell:
    return lambda row: f"{pick(row, key):.{digits}f}"


def value(key: str | tuple[str, ...]) -> Cell:
    return lambda row: pick(row, key)


def joined(key: str | tuple[str, ...], digits: int) -> Cell:
    """The row's figure under ``key``, or under each of several keys shown ``a / b`` (a p50 / p99 pair)."""
    keys = (key,) if isinstance(key, str) else key
    return lambda row: " / ".join(num(row.get(k), digits) for k in keys)


SIDES = ("before", "after")


def side_by_side(label: str, cell: Cell, sides: Iterable[dict]) -> list[object]:
    """A row of a before / after table: its label, then ``cell`` of each side's figures."""
    return [label, *map(cell, sides)]


def named(mapping: dict[str, dict], as_key: str = "name") -> list[dict]:
    """A ``{name: row}`` mapping as rows, each carrying its name under ``as_key``."""
    return [{**row, as_key: name} for name, row in mapping.items()]


class Table:
    """A table spec: its columns as (header, cell) pairs, a cell being a function of one row."""

    def __init__(self, *columns: tuple[str, Cell]) -> None:
        self.columns = columns

    def render(self, rows: Iterable[dict]) -> str:
        return table(
            [header for header, _ in self.columns], [[cell(row) for _, cell in self.columns] for row in rows]
        )


class Body(NamedTuple):
    """What a section's result says: its paragraphs and tables in order, the summary row it adds (question,
    figure and, where it differs from the section's, the command -> result file), and the plots it draws."""

    parts: list[str]
    summary: Sequence[str] | None = None
    plots: dict[str, Callable[[Path], None]] = {}


@dataclass(frozen=True)
class Section:
    """One question the page answers: the result file, the command that reruns it (when the file does not
    record its own), and the function that turns the result into a ``Body``."""

    title: str
    result: str
    command: str
    body: Callable[[dict, str], Body]
    read: Callable[[], dict | None] | None = None  # instead of loading ``result``
    rerun: Callable[[dict, str], str] = lambda data, default: data.get("command", default)
    closing: bool = True  # end with "Command: `...` -> `result`"
    when_missing: str | None = ""  # "" says "not run yet"; None leaves the section out


SECTIONS: list[Section] = []


def section(title: str, result: str, command: str, **options: Any) -> Callable:
    """Registers the function below as a section of the page, in the order of this file."""

    def register(body: Callable[[dict, str], Body]) -> Callable[[dict, str], Body]:
        SECTIONS.append(Section(title, result, command, body, **options))
        return body

    return register


@dataclass
class Page:
    summary: list[list[str]] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    plots: dict[str, Callable[[Path], None]] = field(default_factory=dict)

    def section(self, title: str, *parts: str) -> None:
        self.sections.append("\n\n".join([f"## {title}", *[prose(part) for part in parts if part]]))

    def add(self, spec: Section) -> None:
        data = spec.read() if spec.read else load(spec.result)
        if data is None:
            if spec.when_missing is not None:
                self.section(spec.title, spec.when_missing or missing(spec.result, spec.command))
            return
        command = spec.rerun(data, spec.command)
        body = spec.body(data, command)
        if body.summary:
            self.summary.append([*body.summary, ran(command, spec.result)][:3])
        self.plots.update(body.plots)
        self.section(spec.title, *body.parts, *(closing(command, spec.result) if spec.closing else []))


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


# ---------------------------------------------------------------------------------------------------------
# Serving: embedding and search speed

THROUGHPUT = Table(
    ("backend", value("name")),
    ("sentences/s", number("sentences_per_s")),
    ("x sentence-transformers", fixed("x_baseline", 2)),
    ("mean cosine", number("cosine_mean", 4)),
    ("min cosine", number("cosine_min", 4)),
)


CALLERS = Table(("arm", value("name")), *THROUGHPUT.columns[1:3])


@section("Embedding throughput by backend", "embed_throughput.json", "python benchmarks/embed_throughput.py")
def embedding_throughput(data: dict, command: str) -> Body:
    offline = {k: v for k, v in data["rows"].items() if "callers" not in k}
    callers = {k: v for k, v in data["rows"].items() if "callers" in k}
    best, top = max(offline.items(), key=lambda item: item[1]["sentences_per_s"])
    ratios = data.get("ratios", {})
    rates = {k: v["sentences_per_s"] for k, v in offline.items()}
    title = f"Embedding throughput, {data['sentences']:,} sentences, {data['machine']['cpus']} CPU cores"
    return Body(
        fill(
            "embedding_throughput",
            **figures_of(data, "sentences", "mean_words"),
            cpus=data["machine"]["cpus"],
            offline=THROUGHPUT.render(named(offline)),
            callers=CALLERS.render(named(callers)),
            ratios=(
                fill("embedding_throughput.ratios", **ratios)
                if {"microbatched_vs_offline_int8", "microbatched_vs_offline_torch"} <= ratios.keys()
                else []
            ),
        ),
        summary=[
            "embedding throughput by backend (offline, batch 32)",
            f"{best}: {num(top['sentences_per_s'])} sentences/s, {top['x_baseline']:.2f}x sentence-transformers",
        ],
        plots={"embed_throughput.png": lambda path: bar_chart(path, rates, "sentences/s", title)},
    )


HTTP = Table(
    ("route", lambda arm: f"`{arm['route']}`"),
    ("connections", value("connections")),
    ("req/s", number("requests_per_s")),
    ("in-process sentences/s", number("in_process_sentences_per_s")),
    ("ratio", number("ratio_to_in_process", 2)),
    ("p50 ms", number("p50_ms", 1)),
    ("p99 ms", number("p99_ms", 1)),
    ("errors", lambda arm: arm.get("errors_total", sum(arm["errors"].values()))),
)


@section(
    "Served against offline", "http_throughput.json", "python benchmarks/http_throughput.py --seconds 20"
)
def served_vs_offline(data: dict, command: str) -> Body:
    embed = data["http"].get("/embed", {})
    return Body(
        fill(
            "served_vs_offline",
            **figures_of(data, "backend", "sentences", "load_generator", "load_at_start", "load_at_end"),
            server=data.get("server_checkout", "?").split()[0],
            cpus=data["machine"]["cpus"],
            routes=HTTP.render(named(data["http"], "route")),
        ),
        summary=[
            "served against offline (one sentence a request, 64 connections)",
            f"`POST /embed` {num(embed.get('requests_per_s'))} req/s = "
            f"{num(embed.get('ratio_to_in_process'), 2)}x the in-process rate, p99 {num(embed.get('p99_ms'))} ms",
        ],
    )


def latency_cell(key: str) -> Cell:
    return lambda row: num(row.get(key), 1) if isinstance(row.get(key), float) else str(row.get(key, ""))


@section("Search latency", "search_latency.json", "python benchmarks/search_latency.py")
def search_latency(data: dict, command: str) -> Body:
    columns: list[str] = []
    for row in data["rows"]:  # every field any row has, in the order they first appear
        columns += [key for key in row if key not in columns]
    spec = Table(*[(key.replace("_ms", " ms").replace("_", " "), latency_cell(key)) for key in columns])
    hybrid = [row for row in data["rows"] if row.get("mode") == "hybrid"]
    first, last = (hybrid[0], hybrid[-1]) if hybrid else ({}, {})
    return Body(
        fill(
            "search_latency",
            **figures_of(data, "documents", "backend"),
            latencies=spec.render(data["rows"]),
        ),
        summary=hybrid
        and [
            f"search latency, SciFact ({data['documents']:,} documents), hybrid",
            f"p50 {first['p50_ms']:.1f} ms at c={first['concurrency']}; "
            f"p99 {last['p99_ms']:.0f} ms at c={last['concurrency']}",
        ],
    )


DURING_UPSERT = Table(
    ("arm", value("name")),
    ("commit", value("commit")),
    ("search alone p99 ms", number(("search_alone", "p99_ms"))),
    ("during p50 ms", number(("search_during_upsert", "p50_ms"))),
    ("during p99 ms", number(("search_during_upsert", "p99_ms"))),
    ("upsert docs/s", number(("upsert", "docs_per_s"), 1)),
    ("load", lambda arm: ", ".join(num(x, 1) for x in arm.get("load_average", []))),
)


@section(
    "Searches during a bulk upsert",
    "search_during_upsert.json",
    "python benchmarks/search_latency.py --during-upsert --label after",
    closing=False,
)
def search_during_upsert(data: dict, command: str) -> Body:
    workload = data["workload"]
    commands = "; ".join(f"`{portable(arm['command'])}`" for arm in data["arms"].values())
    return Body(
        fill(
            "search_during_upsert",
            **figures_of(workload, "searches", "upserts", "index", "machine"),
            arms=DURING_UPSERT.render(named(data["arms"])),
            commands=commands,
        )
    )


TRACING = Table(
    ("arm", value("arm")),
    ("route", value("route")),
    ("req/s (median)", number(("median", "requests_per_s"))),
    ("p50 ms", number(("median", "p50_ms"), 1)),
    ("p99 ms", number(("median", "p99_ms"), 1)),
    ("server CPU us/request (median)", number(("median", "server_cpu_us_per_request"))),
    (
        "server CPU us/request, each round",
        lambda row: ", ".join(num(x) for x in row["server_cpu_us_per_request"]),
    ),
)
TRACING_ARMS = {
    "before_off": "before, no tracing",
    "after_off": "after, tracing off",
    "after_on": "after, exporting every request",
    "after_sampled": "after, exporting 1 in 10",
}


def tracing_rows(data: dict) -> list[dict]:
    return [
        {**row, "arm": TRACING_ARMS.get(arm, arm), "route": route}
        for route in ("/search", "/embed")
        for arm, routes in data["arms"].items()
        if (row := routes.get(route))
    ]


def cpu_ratio(data: dict, arm: str, route: str) -> float:
    """An arm's median server CPU per request over the before arm's, on one route."""
    median = lambda name: data["arms"][name][route]["median"]["server_cpu_us_per_request"]  # noqa: E731
    return median(arm) / median("before_off")


@section("What tracing costs", "tracing_cost.json", "python benchmarks/tracing_cost.py --before COMMIT")
def tracing_cost(data: dict, command: str) -> Body:
    loads = [load[0] for arm in data["arms"].values() for route in arm.values() for load in route["load"]]
    spans, before = data["spans_per_request"], data["arms"]["before_off"]
    search_cpu = before["/search"]["median"]["server_cpu_us_per_request"]
    return Body(
        fill(
            "tracing_cost",
            **figures_of(data, "index", "load_generator", "load_at_start", "load_at_end"),
            **figures_of(data["off_path_in_process"], "step_ns", "check_ns"),
            before=data["before"].split()[0],  # the commits' hashes (their subjects are in the result file)
            after=data["after"].split()[0],
            exports=data["otlp_exports_received"]["requests"],
            megabytes=data["otlp_exports_received"]["bytes"] / 1e6,
            rounds=len(before["/search"]["requests_per_s"]),
            lowest_load=min(loads),
            highest_load=max(loads),
            search_spans=spans["POST /search"]["service_spans_median"],
            embed_spans=spans["POST /embed"]["service_spans_median"],
            search_all_spans=spans["POST /search"]["spans_median"],
            search_off_us=spans["POST /search"]["off_path_us_at_most"],
            embed_off_us=spans["POST /embed"]["off_path_us_at_most"],
            search_cpu=search_cpu,
            embed_cpu=before["/embed"]["median"]["server_cpu_us_per_request"],
            arms=TRACING.render(tracing_rows(data)),
        ),
        summary=[
            "what tracing costs on the HTTP path (hybrid `POST /search`)",
            f"off: at most {num(spans['POST /search']['off_path_us_at_most'], 1)} us a search "
            f"({num(100 * spans['POST /search']['off_path_us_at_most'] / search_cpu, 2)}% of its server CPU), "
            f"measured CPU {num(cpu_ratio(data, 'after_off', '/search'), 2)}x before; exporting every request "
            f"{num(cpu_ratio(data, 'after_on', '/search'), 2)}x, "
            f"1 in 10 {num(cpu_ratio(data, 'after_sampled', '/search'), 2)}x",
        ],
    )


# ---------------------------------------------------------------------------------------------------------
# Search quality and scale

BEIR = "cloze eval beir --data ../shared/data/beir-scifact --mode M --backend B"
BEIR_OUT = "--out benchmarks/results/index_scifact_M_B.json"
QUALITY = Table(
    ("mode", value("mode")),
    ("backend", value("backend")),
    ("nDCG@10", number("ndcg@10", 3)),
    ("Recall@100", number("recall@100", 3)),
    ("MRR@10", number("mrr@10", 3)),
    ("queries", value("queries")),
    ("result file", lambda run: f"`{run['file']}`"),
)


def load_quality_runs() -> dict | None:
    """The BEIR SciFact runs of every mode and backend, as one result."""
    runs = []
    for mode in ("dense", "bm25", "hybrid"):
        for backend in ("torch", "onnx-int8"):
            name = f"index_scifact_{mode}_{backend}.json"
            if (data := load(name)) is not None:
                runs.append({**data, "mode": mode, "backend": backend, "file": name})
    return {"runs": runs} if runs else None


@section(
    "Retrieval quality",
    "index_scifact_M_B.json",
    BEIR,
    read=load_quality_runs,
    closing=False,
    when_missing=phrase("retrieval_quality.not_run", command=f"{BEIR} {BEIR_OUT}"),
)
def retrieval_quality(data: dict, command: str) -> Body:
    first, best = data["runs"][0], max(data["runs"], key=lambda run: run["ndcg@10"])
    return Body(
        fill(
            "retrieval_quality",
            **figures_of(first, "queries", "documents", "chunks", "model_id"),
            runs=QUALITY.render(data["runs"]),
            command=f"{BEIR} {BEIR_OUT}",
        ),
        summary=[
            "retrieval quality, SciFact test, bundled model",
            f"nDCG@10 {best['mode']} ({best['backend']}) {best['ndcg@10']:.3f}",
            f"`{BEIR} {BEIR_OUT}`",
        ],
    )


RECALL = Table(
    ("nprobe, rerank", lambda row: row["name"].replace(",", ", ")),
    ("recall@10", number("recall@10", 3)),
    ("ms a query", number("ms_per_query", 2)),
)


@section("Index build at scale", "index_scale.json", "python benchmarks/index_scale.py --passages 1000000")
def index_scale(data: dict, command: str) -> Body:
    figures = [
        ["build, in all", f"{data['build_seconds'] / 60:.1f} min"],
        *[[f"stage: {stage}", f"{seconds / 60:.1f} min"] for stage, seconds in data["stage_seconds"].items()],
        ["passages/s", num(data["passages_per_second"])],
        ["embed stage against the offline rate", f"{data['embed_vs_offline']:.2f}x"],
        ["peak RSS, build", f"{num(data['peak_rss_mb'])} MB"],
        ["index on disk", f"{num(data['index_dir_mb'])} MB"],
        ["open with lexical index", f"{data['open_with_lexical_seconds']} s"],
    ]
    return Body(
        fill(
            "index_scale",
            **figures_of(data, "passages", "sentences_per_passage", "mean_chunk_tokens", "backend"),
            cpus=data["cpu_count"],
            figures=table(["figure", "value"], figures),
            queries=data["queries"],
            recall=RECALL.render(named(data["recall_vs_exact"])),
        ),
        summary=[
            f"index build, {data['passages']:,} passages, `{data['factory']}`",
            f"{data['build_seconds'] / 60:.1f} min ({num(data['passages_per_second'])} passages/s), "
            f"peak RSS {data['peak_rss_mb'] / 1000:.2f} GB",
        ],
    )


def ratios(row: dict | None, prefix: str = "") -> str:
    """p50 / p99 of filtered over unfiltered (``cpu_``: of the searching thread's CPU time, where measured)."""
    if row is None or f"{prefix}p50_ratio" not in row:
        return ""
    return f"{row[f'{prefix}p50_ratio']:.2f} / {row[f'{prefix}p99_ratio']:.2f}"


def recall(row: dict | None) -> str:
    return "" if row is None else num(row.get("recall@10"), 3)


# A row of this tree ("after"), carrying the same configuration's row of the baseline as "before".
FILTERED = Table(
    ("factory", value("factory")),
    ("mode", value("mode")),
    ("filter", value("filter")),
    ("matching", lambda row: f"{row['matching']:.2%}"),
    ("unfiltered p50 ms", fixed(("unfiltered", "p50_ms"), 2)),
    ("ratio before", lambda row: ratios(row["before"])),
    ("ratio after", ratios),
    ("CPU ratio before", lambda row: ratios(row["before"], "cpu_")),
    ("CPU ratio after", lambda row: ratios(row, "cpu_")),
    ("recall before", lambda row: recall(row["before"])),
    ("recall after", recall),
)
CROSSOVER = Table(
    ("factory", value("factory")),
    ("filter", value("filter")),
    ("matching chunks", number("matching_chunks")),
    ("exact", value("exact_ms")),
    ("bitmap", value("bitmap_ms")),
)


def filtered_goals(after: list[dict], unfiltered: dict[str, float]) -> str:
    """How many rows after meet the goals: p50 and p99 within 1.2x (wall time; CPU time where measured),
    recall at least unfiltered."""
    fast = [r for r in after if max(r["p50_ratio"], r["p99_ratio"]) <= 1.2]
    timed_cpu = [r for r in after if "cpu_p50_ratio" in r]
    fast_cpu = [r for r in timed_cpu if max(r["cpu_p50_ratio"], r["cpu_p99_ratio"]) <= 1.2]
    recalled = [r for r in after if "recall@10" in r]
    kept = [r for r in recalled if r["recall@10"] >= unfiltered[r["factory"]]]
    slow = sorted({f"{r['factory']} {r['mode']} {r['filter'].split()[0]}" for r in after if r not in fast})
    slow_cpu = sorted(
        {f"{r['factory']} {r['mode']} {r['filter'].split()[0]}" for r in timed_cpu if r not in fast_cpu}
    )
    return phrase(
        "filtered_corpus.goals",
        fast=len(fast),
        fast_cpu=len(fast_cpu),
        timed_cpu=len(timed_cpu),
        rows=len(after),
        kept=len(kept),
        recalled=len(recalled),
        slow=", ".join(slow) or "none",
        slow_cpu=", ".join(slow_cpu) or "none",
    )


def write_cost(writes: dict[str, dict] | None) -> list[str]:
    """What keeping the columns costs a store-only write, by batch size; nothing when it was not measured."""
    if not writes:
        return []
    batches = [
        phrase(
            "filtered_corpus.write_cost_batch",
            batch=w["batch"],
            with_columns=num(w["docs_per_second"]["with_columns"]),
            without=num(w["docs_per_second"]["without"]),
            slowdown=w["slowdown"],
        )
        for w in writes.values()
    ]
    return fill("filtered_corpus.write_cost", batches="; ".join(batches))


def filtered_corpus(label: str) -> Callable[[dict, str], Body]:
    """A corpus's filtered searches before (a baseline revision's code) and after (this tree), one run."""

    def body(data: dict, command: str) -> Body:
        rows, columns = data["rows"], data["columns"]
        by_plan = {(r["factory"], r["mode"], r["filter"]): r for r in rows if r["plan"] == "before"}
        after = [
            {**r, "before": by_plan.get((r["factory"], r["mode"], r["filter"]))}
            for r in rows
            if r["plan"] == "after"
        ]
        worst = max(after, key=lambda r: r["p99_ratio"])
        documents = columns["documents"]
        unfiltered = ", ".join(f"{k} {v:.3f}" for k, v in data["unfiltered_recall@10"].items())
        note = data.get("note")
        return Body(
            fill(
                "filtered_corpus",
                **figures_of(
                    columns, "fields", "bytes_per_document", "bytes_per_document_per_field", "load_seconds"
                ),
                label=label.capitalize(),
                documents=documents,
                before=baseline(data),
                unfiltered=unfiltered,
                load_start=data["load_average_start"],
                load_end=data["load_average_end"],
                searches=FILTERED.render(after),
                goals=filtered_goals(after, data["unfiltered_recall@10"]),
                crossover=CROSSOVER.render(data["crossover"]),
                array_mb=num(columns["array_bytes"] / 2**20, 1),
                rss_growth_mb=num(columns["rss_growth_bytes"] / 2**20, 1),
                write_cost=write_cost(data.get("write_cost")),
                note=fill("filtered_corpus.note", note=note) if note else [],
            ),
            summary=[
                f"filtered search, {documents:,} documents ({label}), filters matching 0.1-90%",
                f"worst filtered/unfiltered p99 {worst['p99_ratio']:.2f}x after ({worst['factory']}, "
                f"{worst['filter']}, {worst['mode']})",
            ],
        )

    return body


def baseline(data: dict) -> str:
    """What "before" ran: a revision's code in its own process, or (older results) SQLite's plans in-process."""
    if "before" in data:
        return phrase("filtered_corpus.revision", revision=data["before"]["revision"])
    return phrase("filtered_corpus.sqlite_plans")


def filtered_results(name: str) -> Callable[[], dict | None]:
    """A result of the current benchmark (one with a plan per row); an older one's rows compare no plans."""

    def read() -> dict | None:
        data = load(name)
        return data if data is not None and "plan" in data["rows"][0] else None

    return read


section(
    "Filtered search at scale, real text",
    "filtered_search.json",
    "python benchmarks/filtered_search.py real --passages 100000",
    read=filtered_results("filtered_search.json"),
)(filtered_corpus("real text"))
section(
    "Filtered search at scale, synthetic vectors",
    "filtered_search_synthetic.json",
    "python benchmarks/filtered_search.py synthetic",
    read=filtered_results("filtered_search_synthetic.json"),
)(filtered_corpus("synthetic vectors"))


# ---------------------------------------------------------------------------------------------------------
# Memory and snapshots

MODEL_MEMORY = Table(
    ("backend", lambda row: f"{row['backend']} ({row['served_backend']})"),
    ("models", value("models")),
    ("RSS at ready MiB", number("rss_ready_mib")),
    ("RSS warm MiB", number("rss_warm_mib")),
    ("peak MiB", number("peak_mib")),
    ("warm over 1 model", lambda row: f"+{num(row['warm_over_one_model_mib'])}"),
    ("ready after s", number("ready_s")),
)


@section("Memory per model", "model_memory.json", "python benchmarks/model_memory.py")
def model_memory(data: dict, command: str) -> Body:
    auto = [row for row in data["rows"] if row["backend"] == "auto"] or data["rows"]
    most = max(auto, key=lambda row: row["models"])
    per_model = most["warm_over_one_model_mib"] / max(1, most["models"] - 1)
    return Body(
        fill(
            "model_memory",
            **figures_of(data, "model", "fill_mask_model", "warm_up"),
            load_before=data["load_average_before"][0],
            load_after=data["load_average_after"][0],
            servers=MODEL_MEMORY.render(data["rows"]),
        ),
        summary=[
            f"memory per named model (MiniLM, {most['served_backend']})",
            f"{num(auto[0]['rss_warm_mib'])} MiB with one model, about +{num(per_model)} MiB per extra model",
        ],
    )


COLLECTION_MEMORY = Table(
    ("collections", value("collections")),
    ("RSS MiB", number("rss_mib", 1)),
    ("create s", lambda row: row.get("create_s", "")),
    ("after", lambda row: row.get("after", "")),
)


@section("Memory per collection", "collection_memory.json", "python benchmarks/collection_memory.py")
def collection_memory(data: dict, command: str) -> Body:
    rows = data["rows"]
    return Body(
        fill(
            "collection_memory",
            model=data["model"],
            most=rows[-1]["collections"],
            load_before=data["load_average_before"][0],
            servers=COLLECTION_MEMORY.render(rows),
        ),
        summary=[
            "memory per empty collection",
            f"{num(rows[1]['rss_mib'])} MiB with 1, {num(rows[-1]['rss_mib'])} MiB with {rows[-1]['collections']}: "
            f"about {data['per_collection_mib']} MiB each",
        ],
    )


MB = 2**20


@section("Snapshots of a live collection", "snapshot.json", "python benchmarks/snapshot.py --passages 100000")
def snapshots(data: dict, command: str) -> Body:
    snap, alone, during = data["snapshot"], data["search_alone"], data["search_during_snapshot"]
    writes, sizes, loads = (
        data["writes_during_snapshot"],
        data["index_version_bytes"],
        data["load_average_before_and_after"],
    )
    figures = [
        [
            "index version on disk (store + FAISS)",
            f"{num(sizes['store.sqlite'] / MB)} + {num(sizes['vectors.faiss'] / MB)} MB",
        ],
        ["snapshot (`POST /collections/default/snapshots`, answered)", f"{snap['seconds']} s"],
        ["archive (uncompressed tar)", f"{num(snap['bytes'] / MB)} MB"],
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
            f"{data['restore_upload']['seconds']} s",
        ],
    ]
    return Body(
        fill(
            "snapshots",
            **figures_of(data, "passages", "chunks", "factory", "backend"),
            load_before=loads[0][0],
            load_after=loads[1][0],
            cpus=data["cpu_count"],
            figures=table(["measure", "figure"], figures),
        ),
        summary=[
            f"How long does a snapshot of {data['chunks']:,} chunks take, and what does it do to searches?",
            f"{snap['seconds']} s, {num(snap['bytes'] / MB)} MB; search p99 {num(alone['p99_ms'])} ms alone, "
            f"{num(during['p99_ms'])} ms during it",
        ],
    )


@section(
    "Restore by import against the copy it replaced",
    "restore_import.json",
    "python benchmarks/restore_import.py --documents 100000",
)
def restore_import(data: dict, command: str) -> Body:
    def peak(runs: list[dict]) -> float:
        return max(run["peak_rss_mb"] for run in runs)

    rows = [
        [
            f"`{factory}`",
            f"{f['median_restore_seconds']['copy']:.1f} s",
            f"{f['median_restore_seconds']['import']:.1f} s",
            f"{f['import_over_copy']:.1f}x",
            f"{num(peak(f['runs']['copy']))} / {num(peak(f['runs']['import']))} MB",
        ]
        for factory, f in data["factories"].items()
    ]
    loads = data["load_average_before_and_after"]
    ratios = ", ".join(
        f"`{name}` {f['median_restore_seconds']['import']:.1f} s against {f['median_restore_seconds']['copy']:.1f} s "
        f"({f['import_over_copy']:.1f}x)"
        for name, f in data["factories"].items()
    )
    return Body(
        fill(
            "restore_import",
            documents=data["documents"],
            dimension=data["dimension"],
            baseline=data["baseline_commit"][:7],
            load_before=loads[0][0],
            load_after=loads[1][0],
            table=table(
                ["FAISS factory", "copy (before)", "import", "import / copy", "peak RSS, copy / import"], rows
            ),
        ),
        summary=[
            "What does restoring by import (every row checked, FAISS rebuilt) cost over copying the archive's store?",
            f"{data['documents']:,} chunks: {ratios}, synthetic",
        ],
    )


HOST_FIGURES = [  # (label, summary key, digits): the issue 68 table's rows
    ("restart to ready, s", "restart_ready_s", 1),
    ("restart to ready, CPU s", "restart_ready_cpu_s", 1),
    ("first open of the copy (an upgrade), s", "first_open_ready_s", 1),
    ("RSS steady, MB", "rss_steady_mb", 0),
    ("RSS peak, MB", "rss_peak_mb", 0),
    ("index RSS per chunk, B", "index_rss_per_chunk", 0),
    ("RSS from open to ready per chunk, B (today: the in-memory BM25)", "rss_open_to_ready_per_chunk", 0),
    ("peak while opening over the process's own, MB", "open_peak_over_base_mb", 0),
    ("filter columns held, B/chunk", "columns_per_chunk", 0),
    ("disk per chunk, B", "disk_bytes_per_chunk", 0),
    *[
        (f"{mode} {name} p50 / p99, ms", (f"{mode}/{name}_p50_ms", f"{mode}/{name}_p99_ms"), 1)
        for mode in ("bm25", "dense", "hybrid")
        for name in ("none", "10%", "1%")
    ],
    ("BM25 unfiltered p50 / p99, CPU ms", ("bm25/none_cpu_p50_ms", "bm25/none_cpu_p99_ms"), 1),
    ("hybrid unfiltered p50 / p99, CPU ms", ("hybrid/none_cpu_p50_ms", "hybrid/none_cpu_p99_ms"), 1),
    ("upsert (local ack), mean wall / CPU ms", ("upsert_mean_ms", "upsert_cpu_mean_ms"), 1),
    ("fresh replica ready from the bucket, s", "fresh_replica_ready_s", 1),
]


def host_rows(data: dict) -> list[list[object]]:
    sides = [data["summary"][side] for side in SIDES]
    ratios = data["ratios_after_over_before"]
    first = HOST_FIGURES[0][1]
    return [
        [*side_by_side(label, joined(key, digits), sides), host_ratio(ratios, key)]
        for label, key, digits in HOST_FIGURES
        if key != first or sides[0].get(first) is not None
    ]


def host_ratio(ratios: dict, key: str | tuple[str, ...]) -> str:
    """After over before of the row's first figure (the p50 of a p50 / p99 pair)."""
    found = ratios.get(key if isinstance(key, str) else key[0])
    return f"{found:.2f}x" if found else ""


def host_disk_rows(data: dict) -> list[list[object]]:
    arms = [data["arms"][side]["disk"]["per_chunk"] for side in SIDES]
    names = sorted(set(arms[0]) | set(arms[1]), key=lambda n: -max(a.get(n, 0) for a in arms))
    shown = [name for name in names if max(a.get(name, 0) for a in arms) >= 1]  # not SQLite's -shm
    return [side_by_side(f"`{name}`", number(name), arms) for name in shown]


def host_goal_rows(data: dict) -> list[list[str]]:
    return [
        [
            key,
            num(goal["goal"], 1),
            num(goal["value"], 1),
            goal.get("basis", ""),
            "yes" if goal["met"] else "no",
        ]
        for key, goal in data["goals_10m"].items()
    ]


@section(
    "One host at scale: ready after a restart, memory, latency, a fresh replica",
    "host_scale.json",
    "python benchmarks/host_scale.py --chunks 1000000",
)
def host_scale(data: dict, command: str) -> Body:
    after = data["summary"]["after"]
    replica = data["arms"]["after"].get("fresh_replica") or {}
    return Body(
        fill(
            "host_scale",
            **figures_of(data, "chunks", "factory", "vectors", "texts", "arm_seconds", "cpu_count"),
            before=data["before_commit"][:7],
            after=(data["after_commit"] or "the tree")[:7],
            proof=phrase("host_scale.proof") if data["same_index_code"] else "",
            load=data["load_average_start"][0],
            load_end=data["load_average_end"][0],
            build_min=round(data["build"]["process_s"] / 60, 1),
            queries=data["arms"]["after"]["restart"]["queries"]["queries"],
            upserts=data["arms"]["after"]["restart"]["upserts"]["upserts"],
            replica=phrase("host_scale.replica", chunks=replica["chunks"]) if replica else "",
            table=table(["figure", "before", "after", "after / before"], host_rows(data)),
            disk=table(["structure", "before, B/chunk", "after, B/chunk"], host_disk_rows(data)),
            goals=table(["goal at 10M", "goal", "after", "from", "met"], host_goal_rows(data)),
        ),
        summary=[
            f"How soon does one host serve {data['chunks']:,} chunks after a restart, in how much memory?",
            f"{num(data['summary']['before']['restart_ready_s'], 1)} s before, {num(after['restart_ready_s'], 1)} s "
            f"after; RSS {num(after['rss_steady_mb'])} MB; BM25 p50 {num(after['bm25/none_p50_ms'], 1)} ms"
            + (" (a proof run: the same index code on both sides)" if data["same_index_code"] else ""),
        ],
    )


REPLICA_FIGURES = (
    ("ready (`/readyz`), s", ("ready_s",), 1),
    ("CPU s to ready", ("ready_cpu_s",), 1),
    ("download, s", ("stages_s", "base_download_s"), 1),
    ("verified restore, s", ("stages_s", "base_verified_restore_s"), 1),
    ("base, MB", ("base_mb",), 0),
)


@section(
    "A fresh replica from the bucket",
    "host_scale_replica.json",
    "python benchmarks/host_scale.py --replica-only --replica-chunks 100000 --before-rev REV --work WORK",
)
def fresh_replica(data: dict, command: str) -> Body:
    arms = data["arms"]
    sides = [arms["before"], arms["after"]]
    rows = [side_by_side(label, number(key, digits), sides) for label, key, digits in REPLICA_FIGURES]
    projected = data["projection_10m_ready_s"]
    return Body(
        fill(
            "fresh_replica",
            chunks=data["replica_chunks"],
            factory=data["factory"],
            before=data["before_commit"][:7],
            after=data["after_commit"][:7],
            load=data["load_average_start"][0],
            load_end=data["load_average_end"][0],
            table=table(["", "before", "after"], rows),
            before_10m=num(projected["before"] / 60),
            after_10m=num(projected["after"] / 60),
            goal=num(data["goal_10m_ready_s"] / 60),
        ),
        summary=[
            f"How soon does a new replica of {data['replica_chunks']:,} chunks serve?",
            f"{num(arms['after']['ready_s'], 1)} s from an empty folder ({num(arms['before']['ready_s'], 1)} s "
            f"before); about {num(projected['after'] / 60)} min projected at 10M",
        ],
    )


def bm25_scale_rows(data: dict) -> list[list[str]]:
    def cpu(point: dict, name: str) -> str:
        figures = point[name]["cpu"]
        return f"{figures['p50_ms']:.1f} / {figures['p99_ms']:.1f}"

    return [
        [
            f"{point['chunks']:,}",
            cpu(point, "none"),
            cpu(point, "none, 3 words"),
            cpu(point, "10%"),
            cpu(point, "1%"),
            num(point["open_s"], 3),
            num(point["rss_after_queries_mb"]),
            num(point["disk_bytes_per_chunk"]),
            num(point["build_cpu_s"] / 60, 1),
        ]
        for point in data["checkpoints"]
    ]


@section(
    "BM25 at 10M chunks on one host",
    "bm25_at_scale.json",
    "python benchmarks/bm25_at_scale.py --checkpoints 1000000 3000000 10000000 --work WORK",
)
def bm25_at_scale(data: dict, command: str) -> Body:
    largest = data["checkpoints"][-1]
    header = [
        "chunks",
        "no filter, CPU ms p50 / p99",
        "3 words",
        "10%",
        "1%",
        "open s",
        "RSS MB",
        "disk B/chunk",
        "build CPU min",
    ]
    return Body(
        fill(
            "bm25_at_scale",
            queries=largest["queries"],
            load=data["load_average_start"][0],
            load_end=data["load_average_end"][0],
            table=table(header, bm25_scale_rows(data)),
            goal=data["goal_bm25_p50_ms"],
        ),
        summary=[
            f"How fast is BM25 over {largest['chunks']:,} chunks on one host?",
            f"p50 {largest['none']['cpu']['p50_ms']:.1f} ms CPU a sentence, "
            f"{largest['none, 3 words']['cpu']['p50_ms']:.1f} ms three words, "
            f"{largest['1%']['cpu']['p50_ms']:.1f} ms with a 1% filter; opened in {num(largest['open_s'], 2)} s",
        ],
    )


# ---------------------------------------------------------------------------------------------------------
# Training

PRETRAIN_LABELS = {
    "hf_baseline_mlm": "Hugging Face `BertForMaskedLM` + collator",
    "project_mlm": "this project's MLM",
    "project_mlm_bf16": "this project's MLM, bf16 autocast",
    "project_electra": "this project's ELECTRA",
}
PRETRAIN = Table(
    ("step", lambda row: PRETRAIN_LABELS.get(row["name"], row["name"])),
    ("median s", number("median_step_s", 3)),
    ("tokens/s", number("tokens_per_s")),
    ("page faults a step", number("page_faults")),
)


@section(
    "Pre-training step speed",
    "pretrain_throughput.json",
    "python benchmarks/pretrain_throughput.py --run-minutes 30",
)
def pretrain_speed(data: dict, command: str) -> Body:
    faults = data.get("median_page_faults_per_step", {})
    rows = [
        {
            "name": key,
            "median_step_s": data["median_step_s"][key],
            "tokens_per_s": rate,
            "page_faults": faults.get(key),
        }
        for key, rate in data["tokens_per_s"].items()
    ]
    rates = {PRETRAIN_LABELS.get(k, k).replace("`", ""): v for k, v in data["tokens_per_s"].items()}
    title = f"Pre-training step, {data['recipe']}, {data['tokens_per_step']:,} tokens a step"
    timed = data.get("timed_run")
    return Body(
        fill(
            "pretrain_speed",
            **figures_of(data, "recipe", "tokens_per_step", "steps_timed", "threads"),
            steps=PRETRAIN.render(rows),
            timed=(
                fill(
                    "pretrain_speed.timed",
                    minutes=timed["minutes"],
                    steps=timed["steps"],
                    tokens_per_s=num(timed["tokens_per_s"]),
                    accuracy=timed["heldout"]["accuracy"],
                    loss=timed["heldout"]["loss"],
                    peak_gb=timed["peak_rss_mb"] / 1000,
                )
                if timed
                else []
            ),
        ),
        summary=[
            f"pre-training step, {data['recipe']}, {data['threads']} threads",
            f"MLM {data['mlm_speedup_vs_hf']:.2f}x Hugging Face's `BertForMaskedLM` step; "
            f"ELECTRA step {data['electra_over_mlm_step']:.2f}x the MLM step",
        ],
        plots={"pretrain_throughput.png": lambda path: bar_chart(path, rates, "tokens/s", title)},
    )


def heldout(row: dict) -> str:
    held = row.get("heldout", {})
    if "discriminator_auc" in held:
        return f"discriminator AUC {held['discriminator_auc']:.3f}"
    return f"masked-token accuracy {held['accuracy']:.3f}" if "accuracy" in held else ""


ELECTRA = Table(
    ("encoder", value("name")),
    ("pre-train steps", lambda row: num(row.get("pretrain_steps", 0))),
    ("held-out", heldout),
    (
        "STS-B test (NLI stage only)",
        lambda r: f"{r['stsb_test_spearman']:.3f} ({r['stsb_test_spearman_nli_only']:.3f})",
    ),
    ("SICK-R", fixed("sick_r_spearman", 3)),
    ("SciFact nDCG@10", fixed("scifact_ndcg@10", 3)),
)


@section("ELECTRA against MLM", "electra_vs_mlm.json", "python benchmarks/electra_vs_mlm.py")
def electra_vs_mlm(data: dict, command: str) -> Body:
    settings, regression = data["settings"], data.get("minilm_regression")
    electra, mlm = data["electra_vs_mlm"].get("electra"), data["electra_vs_mlm"].get("mlm")
    return Body(
        fill(
            "electra_vs_mlm",
            minutes=settings["pretrain_minutes"],
            overrides=settings["pretrain_overrides"],
            lr_mlm=settings["pretrain_learning_rate"]["mlm"],
            lr_electra=settings["pretrain_learning_rate"]["electra"],
            finetune=settings["finetune"],
            machine=data["machine"],
            encoders=ELECTRA.render(named(data["electra_vs_mlm"])),
            regression=fill("electra_vs_mlm.regression", **regression) if regression else [],
        ),
        summary=electra
        and mlm
        and [
            f"ELECTRA against MLM, {settings['pretrain_minutes']:.0f} minutes of pre-training each",
            f"STS-B test {electra['stsb_test_spearman']:.3f} against {mlm['stsb_test_spearman']:.3f}; "
            f"SciFact nDCG@10 {electra['scifact_ndcg@10']:.3f} against {mlm['scifact_ndcg@10']:.3f}",
        ],
    )


ADAPT_LABELS = {"both": "adapted (MLM + contrastive)", "mlm-only": "MLM stage only"}
ADAPT = Table(
    ("model", value("label")),
    ("SciFact dense", number("dense", 4)),
    ("hybrid", number("hybrid", 4)),
    ("int8 dense", number(("int8", "dense"), 4)),
    ("int8 hybrid", number(("int8", "hybrid"), 4)),
    ("STS-B test", number("sts_b_test", 4)),
    ("MS MARCO dense", number(("msmarco", "dense"), 4)),
    ("result file", lambda row: f"`{row['file']}`"),
)
ADAPT_TRAIN = Table(
    ("model", value("label")),
    ("nDCG@10", number("ndcg@10", 4)),
    ("Recall@100", number("recall@100", 4)),
    ("mode", value("mode")),
)


def adapt_rows(data: dict) -> list[dict]:
    """Every variant of the 60-minute run and of the shorter one; the bundled model once (scored alike)."""
    rows: list[dict] = []
    for name, run in (("adapt_test_60min.json", data), ("adapt_test.json", load("adapt_test.json"))):
        for variant, row in (run or {}).get("scifact", {}).items():
            if variant == "bundled" and rows:
                continue
            label = f"{ADAPT_LABELS.get(variant, variant)}, {run['minutes']:.0f} min"
            msmarco = run.get("msmarco", {}).get(variant, {})
            rows.append(
                {
                    **row,
                    "label": "bundled" if variant == "bundled" else label,
                    "msmarco": msmarco,
                    "file": name,
                }
            )
    return rows


def adapt_train_rows() -> list[dict]:
    train = load("adapt_scifact_train.json") or {}
    labels = {"bundled": "bundled", "adapted_30min": "adapted, 30 min"}
    return [
        {**train[key][mode], "label": labels[key], "mode": mode}
        for key in labels
        if key in train
        for mode in ("dense", "hybrid")
    ]


@section(
    "What `cloze adapt` buys",
    "adapt_test_60min.json",
    "python benchmarks/adapt.py --minutes 60 --split test --msmarco",
)
def adapt(data: dict, command: str) -> Body:
    bundled, both = data["scifact"]["bundled"], data["scifact"].get("both", {})
    train_rows = adapt_train_rows()
    return Body(
        fill(
            "adapt",
            models=ADAPT.render(adapt_rows(data)),
            train=fill("adapt.train", models=ADAPT_TRAIN.render(train_rows)) if train_rows else [],
        ),
        summary=[
            f"what `cloze adapt` buys, SciFact test, {data['minutes']:.0f} minutes",
            f"dense {bundled['dense']:.4f} -> {both.get('dense', 0):.4f}, "
            f"hybrid {bundled['hybrid']:.4f} -> {both.get('hybrid', 0):.4f}",
        ],
    )


CHECK_LABELS = {
    "both": "`cloze adapt` (checked)",
    "unguarded": "the same run's blend, unchecked",
    "teacher": "`cloze adapt --teacher` (checked)",
}


def held_out(row: dict) -> str:
    check = row.get("guard") or {}
    return f"{check['start']['decision']} -> {check['adapted']['decision']}" if check.get("decision") else ""


def kept(row: dict) -> str:
    check = row.get("guard") or {}
    return f"{check['decision']} (weight {check['alpha']})" if check.get("decision") else ""


ADAPT_CHECK = Table(
    ("encoder", lambda row: CHECK_LABELS.get(row["name"], row["name"])),
    ("SciFact test dense", number("dense", 4)),
    ("held-out check", held_out),
    ("kept", kept),
)


@section(
    "The adaptation check",
    "adapt_guard_test.json",
    "python benchmarks/adapt.py --minutes 20 --variants both unguarded --modes dense --no-sts --no-int8",
    when_missing=None,
)
def adapt_check(data: dict, command: str) -> Body:
    """``cloze adapt``'s result check on SciFact: what each run handed back, against what it trained."""
    bundled, both = data["scifact"]["bundled"]["dense"], data["scifact"].get("both", {})
    return Body(
        fill(
            "adapt_check",
            minutes=data["minutes"],
            note=data.get("note", ""),
            encoders=ADAPT_CHECK.render(named(data["scifact"])),
        ),
        summary=[
            f"`cloze adapt` never hands back a worse encoder, SciFact test, {data['minutes']:.0f} minutes",
            f"dense {bundled:.4f} -> {both.get('dense', 0):.4f} ({(both.get('guard') or {}).get('decision')} kept)",
        ],
    )


RERANK_DATA = {"scifact-dev": "SciFact train (dev)", "scifact": "SciFact test", "msmarco": "MS MARCO subset"}
RERANK_LATENCY = Table(
    ("search", value("arm")),
    ("connections", value("connections")),
    ("requests", value("requests")),
    ("requests/s", number("requests_per_s", 1)),
    ("p50 ms", number("p50_ms", 0)),
    ("p99 ms", number("p99_ms", 0)),
    ("errors", value("errors_total")),
    ("load", lambda row: row["load"][0]),
)


def rerank_table(weight: str | None) -> Table:
    """The reranked rows; the blend column is the rank blend whose weight scored best on dev."""
    paired = "paired_vs_first_stage"
    return Table(
        ("data", lambda row: RERANK_DATA.get(row["dataset"], row["dataset"])),
        ("first stage", value("mode")),
        ("candidates", value("candidates")),
        ("reranker backend", value("backend")),
        ("first stage nDCG@10", number(("first_stage", "ndcg@10"), 4)),
        ("reranked", number(("reranked", "ndcg@10"), 4)),
        ("difference [95% CI]", lambda row: f"{row[paired]['ndcg@10']:+.4f} {row[paired]['ci95']}"),
        (
            f"blend {weight} (chosen on dev)" if weight else "blend",
            lambda row: num(row["blend_ndcg@10"][weight], 4) if weight and "blend_ndcg@10" in row else "",
        ),
        ("queries", value("queries")),
    )


def dev_blend_weight(rows: list[dict]) -> str | None:
    """The reranker's weight in the rank blend that scored best on the held-out train queries (ties: the
    lighter weight), or None without a dev row."""
    dev = [r for r in rows if r["dataset"] == "scifact-dev" and "blend_ndcg@10" in r]
    if not dev:
        return None
    blend = max(dev, key=lambda r: r["candidates"])["blend_ndcg@10"]
    return max(blend, key=lambda w: (blend[w], -float(w)))


def rerank_training(data: dict) -> dict[str, Any]:
    """The training run's figures: its recipe, its data, its dev check, the load."""
    training = data["training"]
    recipe, dev, mining = training["recipe"], training.get("dev", {}), training["data"]["mining"]
    loads = data["load_average_1min_samples"]
    return {
        "base_model": Path(training["base_model"]).name,
        "loss": recipe["loss"],
        "negatives": recipe["num_negatives"],
        "max_length": recipe["max_length"],
        "queries": training["data"]["train_queries"],
        "rows": training["rows"],
        "steps": training["steps"],
        "epochs": training["epochs"],
        "train_minutes": training["train_seconds"] / 60,
        "budget_minutes": recipe["max_time_minutes"],
        "training_loss": (
            phrase("rerank.training_loss", first=training["loss"][0], last=training["loss"][1])
            if "loss" in training
            else ""
        ),
        "dev_queries": dev.get("queries", 0),
        "dev_candidates": dev.get("candidates", 0),
        "dev_first_stage": dev.get("first_stage_ndcg@10", ""),
        "dev_reranked": dev.get("reranked_ndcg@10", ""),
        "mined": mining["negatives"],
        "guarded": mining["guarded"],
        "first_stage": data["rows"][0]["first_stage_backend"] if data["rows"] else "",
        "load_low": min(loads),
        "load_high": max(loads),
        "short": phrase("rerank.short") if training["epochs"] < 1 else "",
    }


def rerank_latency(latency: dict | None) -> list[str]:
    """``/search`` with and without rerank under wrk, one server, side by side."""
    if not latency:
        return []
    return fill(
        "rerank.latency",
        candidates=latency["candidates"],
        backends=", ".join(sorted({m.get("backend", "?") for m in latency["reranker"]})),
        seconds=latency["seconds_per_setting"],
        searches=RERANK_LATENCY.render(latency["rows"]),
        command=closing(latency["command"], "rerank.json"),
    )


@section(
    "What a trained reranker buys",
    "rerank.json",
    "python benchmarks/rerank.py --train-minutes 60 --model MODEL",
    rerun=lambda data, default: " ; ".join(data["commands"]),
    closing=False,
)
def rerank(data: dict, command: str) -> Body:
    order = list(RERANK_DATA)
    rows = sorted(
        data["rows"], key=lambda r: (order.index(r["dataset"]), r["mode"], r["candidates"], r["backend"])
    )
    tests = [r for r in data["rows"] if r["dataset"] == "scifact" and r["mode"] == "hybrid"]
    best = max(tests, key=lambda r: (r["candidates"], r["backend"] == "torch"), default=None)
    return Body(
        fill(
            "rerank",
            **rerank_training(data),
            reranked=rerank_table(dev_blend_weight(data["rows"])).render(rows),
            command=closing(command, "rerank.json"),
            latency=rerank_latency(data.get("latency")),
        ),
        summary=best
        and [
            f"what a reranker trained {data['training']['train_seconds'] / 60:.0f} min on SciFact train buys",
            f"hybrid {best['first_stage']['ndcg@10']:.4f} -> {best['reranked']['ndcg@10']:.4f} "
            f"(top {best['candidates']} reranked, SciFact test nDCG@10)",
            ran(data["commands"][0], "rerank.json"),
        ],
    )


FILL_MASK = [  # (measure, where one model's figure is in the file, digits)
    ("suite: top-1 accepted", ("suite", "top1_accepted"), 2),
    ("suite: top-5 accepted", ("suite", "top5_accepted"), 2),
    ("suite: top-1 copied from the sentence", ("suite", "top1_copied"), 2),
    (
        "WikiText-2 test: accuracy, BERT token masking 15%",
        ("wikitext2_test_heldout", "bert_token_15", "accuracy"),
        3,
    ),
    (
        "WikiText-2 test: accuracy, whole content words 40%",
        ("wikitext2_test_heldout", "whole_word_content_40", "accuracy"),
        3,
    ),
    ("LAMA T-REx P@1", ("lama", "p@1"), 3),
    ("LAMA T-REx P@10", ("lama", "p@10"), 3),
    ("LAMA Google-RE P@1", ("lama", "google_re", "p@1"), 3),
    ("LAMA SQuAD P@1", ("lama", "squad", "p@1"), 3),
    ("fill-mask call, median ms (interleaved)", ("latency", "median_ms"), 1),
]


def fill_mask_rows(data: dict) -> list[list[object]]:
    """Each measure before and after: the side (``before``/``after``) is the second key of every path."""
    return [
        side_by_side(label, number(path[1:], digits), [pick(data, (path[0], side)) for side in SIDES])
        for label, path, digits in FILL_MASK
    ]


@section(
    "The default fill-mask model",
    "fill_mask_all_layers.json",
    "python benchmarks/fill_mask_quality.py",
    closing=False,
)
def fill_mask(data: dict, command: str) -> Body:
    suite, lama = data["suite"], data["lama"]
    return Body(
        fill(
            "fill_mask",
            steps=data.get("training", {}).get("steps", "?"),
            sentences=suite["after"]["sentences"],
            facts=lama["after"]["facts"],
            measures=table(["measure", "before", "after"], fill_mask_rows(data)),
            ran=ran(command, "fill_mask_all_layers.json"),
        ),
        summary=[
            "the default fill-mask model: plausibility suite, LAMA",
            f"top-1 accepted {suite['after']['top1_accepted']:.0%} (was {suite['before']['top1_accepted']:.0%}), "
            f"copied {suite['after']['top1_copied']:.0%}; T-REx P@1 {lama['after']['p@1']:.3f} (was "
            f"{lama['before']['p@1']:.3f})",
            ran(command.split(" --")[0], "fill_mask_all_layers.json"),
        ],
    )


INFINITY = Table(
    ("engine", value("engine")),
    ("backend", value("backend")),
    ("seconds", number("seconds", 1)),
    ("sentences/s", number("sentences_per_s")),
    ("tokens/s", number("tokens_per_s")),
)


@section(
    "Against Infinity and sentence-transformers",
    "infinity_comparison.json",
    "python benchmarks/compare_infinity.py",
)
def infinity(data: dict, command: str) -> Body:
    work, fastest = data["workload"], max(data["rows"], key=lambda row: row["sentences_per_s"])
    return Body(
        fill(
            "infinity",
            **figures_of(work, "requests", "sentences_per_request", "sentences"),
            date=data["date"],
            engines=INFINITY.render(data["rows"]),
        ),
        summary=[
            f"against Infinity, {work['requests']} requests of {work['sentences_per_request']} sentences",
            f"fastest: {fastest['engine']} ({fastest['backend']}) {num(fastest['sentences_per_s'])} sentences/s",
        ],
    )


# ---------------------------------------------------------------------------------------------------------
# Reliability and the GPU

RELIABILITY = [  # result file, the command that makes it, the question it answers
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
RELIABILITY_RUNS = Table(
    ("question", value("question")), ("command", value("command")), ("result file", value("file"))
)


def load_reliability_runs() -> dict:
    rows = []
    for name, default, question in RELIABILITY:
        if (data := load(name)) is not None:
            recorded = data.get("command", "")
            command = recorded if recorded.startswith("python ") else default  # else: a note, not a command
            rows.append({"question": question, "command": f"`{portable(command)}`", "file": f"`{name}`"})
    return {"rows": rows}


@section("Reliability runs", "", "", read=load_reliability_runs, closing=False)
def reliability(data: dict, command: str) -> Body:
    return Body(fill("reliability", runs=RELIABILITY_RUNS.render(data["rows"])))


@section(
    "Running the benchmarks on a GPU",
    "gpu.json",
    "python benchmarks/gpu.py",
    read=lambda: {"run": load("gpu.json")},
    closing=False,
)
def gpu(data: dict, command: str) -> Body:
    run = data["run"]
    held = (
        fill("gpu.held", command=portable(run.get("command", command)), cuda=run.get("cuda")) if run else []
    )
    return Body(fill("gpu", held=held))


def layout_rows(data: dict) -> list[list[object]]:
    """The batcher with a long queue, then each served shape, before and after, from one --compare-layout run."""
    queues = [data["queue_of_16384_texts"][side] for side in SIDES]
    rows = [
        side_by_side(
            f"batcher, {queues[1]['texts']:,} texts queued: passes (texts a pass at most)",
            lambda queue: f"{queue['passes']:,} ({queue['max_batch_size']:,})",
            queues,
        ),
        side_by_side("batcher CPU a text", lambda queue: f"{num(queue['cpu_us_per_text'])} us", queues),
    ]
    for shape in data["served"]["after"]["arms"]:
        arms = [data["served"][side]["arms"][shape] for side in SIDES]
        rows += [
            side_by_side(
                f"{shape} ({arms[1]['connections']} connections): texts/s", number("texts_per_s"), arms
            ),
            side_by_side(f"{shape}: p50 / p99 ms", joined(("p50_ms", "p99_ms"), 0), arms),
            side_by_side(
                f"{shape}: server CPU a text embedded",
                lambda arm: f"{num(arm['server_cpu_us_per_text_embedded'])} us",
                arms,
            ),
        ]
    return rows


@section(
    "The GPU's pass layout on a CPU",
    "http_cuda_layout.json",
    "python benchmarks/http_throughput.py --compare-layout BEFORE --thin",
)
def gpu_layout(data: dict, command: str) -> Body:
    inprocess, after = data["in_process"], data["served"]["after"]["checkout"].split()[0]
    return Body(
        fill(
            "gpu_layout",
            after=after,
            load_generator=data["load_generator"],
            cpus=data["machine"]["cpus"],
            load_at_end=data["load_at_end"][0],
            measures=table(["measure", "before", "after"], layout_rows(data)),
            cpu_us_per_text=num(inprocess["cpu_us_per_sentence"]),
            sentences_per_s=num(inprocess["sentences_per_s"]),
        )
    )


def seconds(ms: float) -> str:
    return f"{ms / 1000:.2f} s"


@section(
    "Replicas on other hosts",
    "replication.json",
    "python benchmarks/replication.py --passages 10000 --large-passages 100000",
)
def replication(data: dict, command: str) -> Body:
    seen, upsert, killed = (
        data["visible_on_every_replica"],
        data["writer_upsert_5_docs"],
        data["killed_replica"],
    )
    copies = [data["fresh_replica0_base_copy_s"], data["fresh_replica1_base_copy_s"]]
    ready = [data["fresh_replica0_ready_s"], data["fresh_replica1_ready_s"]]
    rows = [
        [
            "an acknowledged write readable on every replica (p99 <= 5 s, max <= 10 s)",
            f"p50 {seconds(seen['p50_ms'])}, p99 {seconds(seen['p99_ms'])}, max {seconds(seen['max_ms'])} "
            f"({seen['n']} writes)",
        ],
        [
            "writer upsert p50, local mode, against no replication (at most 10% slower)",
            f"{num(upsert['local']['p50_ms'])} ms against {num(upsert['off']['p50_ms'])} ms",
        ],
        ["what remote mode adds at p99 (<= 100 ms)", remote_added(upsert)],
        [
            f"a fresh replica of {data['passages']:,} passages ready",
            f"the base copied and restored in {min(copies)}-{max(copies)} s; ready {min(ready)}-{max(ready)} s "
            "after the process started (process and model start included)",
        ],
    ]
    if large := data.get("fresh_large_replica"):
        rows.append(
            [f"a fresh replica of {large['passages']:,} passages ready (<= 60 s)", large_ready(large)]
        )
    rows.append(
        [
            f"a killed replica converged at {data['passages']:,} passages (<= 30 s; "
            f"{killed['writes_while_down']} writes while it was down)",
            f"{killed['restart_to_converged_s']} s from the restart (ready after "
            f"{killed['restart_to_ready_s']} s, its own copy reopened: no base copied)",
        ]
    )
    return Body(
        fill(
            "replication",
            model=data["model"],
            load=data["load_average"][0],
            measures=table(["question (target)", "measured"], rows),
            faults=replication_faults(load("replication_faults.json")),
        ),
        summary=[
            "a write visible on every replica",
            f"p99 {seconds(seen['p99_ms'])}, max {seconds(seen['max_ms'])}",
        ],
    )


def replication_faults(faults: dict | None) -> list[str]:
    """The fault record's rounds on one cluster, when they were run: how fast each fault was seen and healed,
    and with the scenarios the acknowledged writes each lost."""
    if faults is None:
        return []
    figures = faults["figures"]
    healing = dict(
        ran=ran(faults["command"], "replication_faults.json"),
        killed_median=median(figures["killed_replica_converged_after_ready_s"]),
        killed_max=max(figures["killed_replica_converged_after_ready_s"]),
        stale_max=max(figures["cut_flagged_stale_after_s"]),
        healed_max=max(figures["cut_healed_converged_s"]),
        local_max=max(figures["paused_bucket_local_write_s"]),
        remote_median=median(figures["paused_bucket_remote_write_s"]),
    )
    if "summary" in faults:  # with the scenarios of tests/replication/faults.py
        record = fill(
            "replication.faults.scenarios",
            **figures_of(faults, "rounds", "green", "scenarios_run"),
            minutes=faults["total_seconds"] / 60,
            load=faults["load_average"][0],
            table=scenario_table(faults["summary"]),
            **healing,
        )
    else:
        record = fill("replication.faults.tests_only", **figures_of(faults, "runs", "green"), **healing)
    return fill("replication.faults", record=record)


def scenario_table(summary: dict) -> str:
    """A row per scenario: rounds green, and for a measured one the acknowledged writes and those lost."""
    rows = []
    for name, row in summary.items():
        measured = "remote_acked" in row
        converged = row.get("converged_s") or {}
        rows.append(
            [
                name,
                f"{row['green']} of {row['rounds']}",
                f"{row['remote_acked']:,} / {row['local_acked']:,}" if measured else "-",
                f"{row['remote_acked_lost_on_writer']} / {row['remote_acked_lost_on_a_replica']}"
                if measured
                else "-",
                str(row["local_acked_lost_on_writer"]) if measured else "-",
                f"{converged['median']} / {converged['max']} s" if converged else "-",
            ]
        )
    header = [
        "scenario",
        "green",
        "acked remote / local",
        "remote-acked lost: writer / a replica",
        "local-acked lost on the writer",
        "converged, median / max",
    ]
    return table(header, rows)


def remote_added(upsert: dict) -> str:
    """Remote mode against local mode at p99 and p50, and against the baseline checkout's when measured."""
    said = (
        f"{upsert['remote']['p99_ms'] - upsert['local']['p99_ms']:+,.0f} ms: p99 {num(upsert['remote']['p99_ms'])} "
        f"ms against {num(upsert['local']['p99_ms'])} ms local; p50 {num(upsert['remote']['p50_ms'])} ms against "
        f"{num(upsert['local']['p50_ms'])} ms"
    )
    if "baseline_remote" in upsert:
        said += (
            f" (the code before, in the same rounds: p99 {num(upsert['baseline_remote']['p99_ms'])} ms against "
            f"{num(upsert['baseline_local']['p99_ms'])} ms local)"
        )
    return said


def large_ready(large: dict) -> str:
    stages = large["stages_s"]
    return (
        f"ready {large['ready_s']} s after the process started, converged {large['converged_s']} s: models "
        f"loaded by {stages['fill_mask_model_loaded']} s, then the {num(large['base_mb'])} MB base downloaded in "
        f"{stages['base_download_s']} s and restored (verified, opened) in {stages['base_verified_restore_s']} s"
    )


# ---------------------------------------------------------------------------------------------------------


def render() -> Page:
    page = Page()
    for spec in SECTIONS:
        page.add(spec)
    return page


def text(page: Page) -> str:
    head = [prose(part) for part in fill("page")]
    summary = "## Summary\n\n" + table(["question", "figure", "command -> result file"], page.summary)
    return "\n\n".join([*head, summary, *page.sections]) + "\n"


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
