"""Int8 with per-batch (dynamic) activation scales against calibrated (fixed) ones, side by side.

Both graphs come from the same fp32 export of the bundled model: ``quantize_dynamic_int8`` alone (what the
int8 backend served before), and that followed by ``fix_activation_scales`` (what it serves now, calibrated on
the package's public-domain prose). For each, on real text of several kinds:

- agreement with fp32: cosine of each text's vector, every text run alone;
- batch dependence: each text's vector alone against the same text in one padded pass of 8 consecutive texts,
  and in a pass of texts of exactly its own length (no padding at all);
- time: median thread CPU time of single-threaded passes, the two graphs alternated.

    python benchmarks/int8_calibration.py      # writes benchmarks/results/int8_calibration.json
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import command  # noqa: E402
from encoder_runtime.backends.onnx_backend import OnnxBackend  # noqa: E402
from encoder_runtime.backends.onnx_export import (  # noqa: E402
    default_cache_dir,
    ensure_onnx,
    quantize_dynamic_int8,
)
from encoder_runtime.backends.static_int8 import fix_activation_scales  # noqa: E402
from encoder_runtime.encoder import EncoderRuntime  # noqa: E402
from encoder_runtime.model_dir import ModelInfo, resolve_model_path  # noqa: E402
from encoder_runtime.tokenization import TextTokenizer  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
# A few hand-written lines of kinds the calibration prose has none of (labelled as such in the result).
CODE = [
    "def keep(x):\n    return {k: v for k, v in x.items() if v is not None}",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    '<div class="nav"><a href="/home">Home</a></div>',
    "ERROR 2026-12-01T10:00:00Z worker-3 OOMKilled exit=137",
    "42 3.14159 1e-9 0xDEADBEEF 127.0.0.1:8080",
]
OTHER_LANGUAGES = [
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le chat est assis sur le tapis près de la fenêtre.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "El niño come una manzana roja.",
]


def corpus_texts(name: str, limit: int) -> list[str]:
    texts = []
    with gzip.open(DATA / name / "corpus.jsonl.gz", "rt") as lines:
        for line in lines:
            doc = json.loads(line)
            texts.append(f"{doc.get('title', '')} {doc['text']}".strip())
            if len(texts) == limit:
                return texts
    return texts


def sts_sentences(limit: int) -> list[str]:
    with open(DATA / "stsbenchmark" / "sts-test.csv", encoding="utf-8") as rows:
        return [row[5] for row in csv.reader(rows, delimiter="\t", quoting=csv.QUOTE_NONE) if len(row) > 6][
            :limit
        ]


class Embedder:
    """The runtime's own pass (pad, forward, pool, normalise) over one ONNX graph, single-threaded as served."""

    def __init__(self, path: Path, info: ModelInfo, tokenizer: TextTokenizer, int8: bool = True):
        backend = OnnxBackend(path, "embed", tokenizer.input_names, "cpu", int8=int8, threads=1)
        self.runtime = EncoderRuntime(info, tokenizer, backend)

    def __call__(self, items) -> np.ndarray:
        return self.runtime.finish(self.runtime.run(items), normalize=True)

    def alone(self, items) -> np.ndarray:
        return np.vstack([self([item]) for item in items])


def batch_dependence(embed: Embedder, items, alone: np.ndarray) -> dict:
    padded = np.vstack([embed(items[i : i + 8]) for i in range(0, len(items), 8)])
    by_length = collections.defaultdict(list)
    for index, item in enumerate(items):
        by_length[len(item)].append(index)
    same = [
        (group[0], embed([items[i] for i in group[:8]])[0]) for group in by_length.values() if len(group) > 1
    ]
    padded_cos = (padded * alone).sum(axis=1)
    same_cos = np.array([float(vector @ alone[index]) for index, vector in same]) if same else None
    return {
        "padded_pass_of_8_cosine_min": float(padded_cos.min()),
        "padded_pass_of_8_cosine_mean": float(padded_cos.mean()),
        "same_length_pass_cosine_min": None if same_cos is None else float(same_cos.min()),
        "same_length_pass_cosine_mean": None if same_cos is None else float(same_cos.mean()),
        "same_length_groups": len(same),
        "max_abs_difference": float(np.abs(padded - alone).max()),
    }


def pass_times(graphs: dict[str, Embedder], items, rounds: int) -> dict:
    """Median thread CPU time per pass over the same batches, the graphs alternated round by round."""
    batches = [items[i : i + 4] for i in range(0, len(items), 4)]
    times = {name: [] for name in graphs}
    for embed in graphs.values():
        embed(batches[0])
    for _ in range(rounds):
        for name, embed in graphs.items():
            for one in batches:
                started = time.thread_time()
                embed(one)
                times[name].append((time.thread_time() - started) * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="model folder or hub id (default: the bundled model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "int8_calibration.json")
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    info = ModelInfo.read(path)
    tokenizer = TextTokenizer(path, info.max_tokens)
    fp32 = ensure_onnx(path, "embed", False, tokenizer.input_names, default_cache_dir(path))
    recipe = json.loads((fp32.parent / "embed.json").read_text())["recipe"]
    with tempfile.TemporaryDirectory() as tmp:
        dynamic, calibrated = Path(tmp) / "dynamic.onnx", Path(tmp) / "calibrated.onnx"
        quantize_dynamic_int8(fp32, dynamic, recipe)
        started = time.perf_counter()
        fix_activation_scales(dynamic, calibrated, tokenizer)
        calibration_s = time.perf_counter() - started
        reference = Embedder(fp32, info, tokenizer, int8=False)
        graphs = {
            "dynamic": Embedder(dynamic, info, tokenizer),
            "calibrated": Embedder(calibrated, info, tokenizer),
        }
        kinds = {
            "stsb_test_sentences": sts_sentences(300),
            "scifact_documents": corpus_texts("beir-scifact", 200),
            "msmarco_passages": corpus_texts("beir-msmarco-subset", 300),
            "hand_written_code_and_logs": CODE,
            "hand_written_other_languages": OTHER_LANGUAGES,
        }
        results = {}
        for kind, texts in kinds.items():
            items = tokenizer.encode(texts)
            exact = reference.alone(items)
            results[kind] = {"texts": len(texts)}
            for name, embed in graphs.items():
                alone = embed.alone(items)
                agreement = (alone * exact).sum(axis=1)
                results[kind][name] = {
                    "cosine_to_fp32_mean": float(agreement.mean()),
                    "cosine_to_fp32_min": float(agreement.min()),
                    **batch_dependence(embed, items, alone),
                }
            print(kind, json.dumps(results[kind]), flush=True)
        timing_items = tokenizer.encode(kinds["stsb_test_sentences"][:64])
        timing = pass_times(graphs, timing_items, args.rounds)
    report = {
        "command": command(),
        "model": str(path),
        "recipe": recipe,
        "calibration_seconds": round(calibration_s, 1),
        "quality": results,
        "pass_cpu_us_median_4_sentences": timing,
        "calibrated_to_dynamic_time": timing["calibrated"] / timing["dynamic"],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "quality"}, indent=2))


if __name__ == "__main__":
    main()
