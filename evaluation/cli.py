"""``cloze eval sts|lama|beir``: the evaluators of this package. Heavy imports stay in the handlers.
(``cloze eval mlm`` is pre-training's own: ``encoder_training.pretraining.cli``.)

Each command prints one JSON object as its last stdout line, for scripts to parse; programs call the
evaluators themselves (``evaluate_sts``, ``evaluate_lama``, ``evaluate_beir``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.data_folder import default_data_dir

BACKENDS = ["auto", "torch", "onnx", "onnx-int8"]


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    evaluate = groups["eval"]
    _add_sts(evaluate)
    _add_lama(evaluate)
    _add_beir(evaluate)


def _add_sts(evaluate: argparse._SubParsersAction) -> None:
    p = evaluate.add_parser("sts", help="Spearman of cosine similarity on STS-B test (and SICK-R, STS12-16)")
    p.add_argument("--model", default="", help="model folder (default: bundled model)")
    p.add_argument(
        "--sets", nargs="+", default=["stsb-test"], help="stsb-test stsb-dev sick-r sts12 .. sts16, or all"
    )
    p.add_argument("--backend", default="torch", choices=BACKENDS)
    p.add_argument("--limit", type=int, help="at most this many pairs per set")
    p.add_argument("--data-dir", type=Path, default=None)
    p.set_defaults(handler=_sts)


def _sts(args: argparse.Namespace) -> None:
    from evaluation.sts import evaluate_sts

    result = evaluate_sts(
        args.model or None, args.data_dir or default_data_dir(), args.sets, args.backend, args.limit
    )
    for name, scores in result["sets"].items():
        print(f"{name:10s} spearman {scores['spearman']:.4f}  pairs {scores['pairs']}")
    print(json.dumps(result))


def _add_lama(evaluate: argparse._SubParsersAction) -> None:
    p = evaluate.add_parser("lama", help="LAMA precision@1/@10 (T-REx, Google-RE, SQuAD)")
    p.add_argument("--model", default="", help="MLM folder (default: the service's default fill-mask model)")
    p.add_argument("--data", type=Path, default=None, help="LAMA folder (default: DATA_DIR/lama)")
    p.add_argument("--limit", type=int, help="at most this many facts per relation (default: all)")
    p.set_defaults(handler=_lama)


def _lama(args: argparse.Namespace) -> None:
    from encoder_runtime.default_fill_mask import default_fill_mask_path
    from evaluation.lama import evaluate_lama

    model = Path(args.model) if args.model else default_fill_mask_path()
    data = args.data or default_data_dir() / "lama"
    print(json.dumps(evaluate_lama(model, data, limit=args.limit or 0)))


def _add_beir(evaluate: argparse._SubParsersAction) -> None:
    p = evaluate.add_parser("beir", help="nDCG@10 / Recall@100 / MRR@10 on a BEIR-layout folder")
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--model", default="", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--mode", choices=["dense", "bm25", "hybrid"], default="dense")
    p.add_argument("--split", default="test", help="the qrels file: qrels/<split>.tsv (test, train, dev)")
    p.add_argument(
        "--fusion",
        action="append",
        metavar="rrf[:K]|convex[:ALPHA]",
        help="hybrid's fusion (default rrf:60); repeat it to score several over one index and one query pass",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=101,
        help="hits asked a query (default 101: Recall@100 after dropping an identical id); 10 scores what a "
        "served top-10 search ranks (hybrid's fusion pool is max(30, 3 x top_k))",
    )
    p.add_argument("--index", type=Path, help="index directory to build or reuse (default: a cache folder)")
    p.add_argument(
        "--out", type=Path, help="JSON result file (default: eval-<split>-<mode>.json in the index folder)"
    )
    p.set_defaults(handler=_beir)


def _beir(args: argparse.Namespace) -> None:
    from encoder_runtime import load_encoder
    from evaluation.beir import default_index_dir, evaluate_beir_fusions
    from index.query.ranking import Fusion

    try:
        fusions = [Fusion.parse(text) for text in args.fusion or []]
    except ValueError as exc:
        raise SystemExit(f"cloze eval beir: --fusion: {exc}") from exc
    if fusions and args.mode != "hybrid":
        raise SystemExit("cloze eval beir: --fusion applies to --mode hybrid only")
    encoder = load_encoder(args.model or None, backend=args.backend)
    backend = encoder.backend.name
    index_dir = args.index or default_index_dir(args.data, encoder, backend)
    results = evaluate_beir_fusions(
        args.data,
        encoder,
        args.mode,
        backend,
        index_dir,
        args.split,
        sys.stderr.isatty(),
        fusions or None,
        args.top_k,
    )
    print(f"{'mode':8} {'fusion':10} {'backend':10} {'nDCG@10':>8} {'R@100':>8} {'MRR@10':>8} {'queries':>8}")
    for label, result in zip([f.label() for f in fusions] or [""], results, strict=True):
        print(
            f"{result['mode']:8} {label:10} {backend:10} {result['ndcg@10']:8.4f} {result['recall@100']:8.4f} "
            f"{result['mrr@10']:8.4f} {result['queries']:8d}"
        )
    for fusion, result in zip(fusions[1:], results[1:], strict=False):
        paired = result["paired_vs_first"]
        print(
            f"{fusion.label()} - {fusions[0].label()}: nDCG@10 {paired['ndcg@10']:+.4f}, 95% CI {paired['ci95']}, "
            f"{paired['better']} queries up, {paired['worse']} down"
        )
    default_name = f"eval-{args.split}-{args.mode}{'-fusions' if fusions else ''}.json"
    out = args.out or Path(index_dir) / default_name
    out.parent.mkdir(parents=True, exist_ok=True)
    written = results[0] if len(results) == 1 and not fusions else results
    out.write_text(json.dumps(written, indent=2))
    print(f"written: {out}")
    print(json.dumps(written))
