"""The one entry point, ``cloze``: sub-commands per stage. Heavy imports happen inside the handlers,
so ``cloze --help`` is instant.

Each stage registers its own sub-commands (``app.cli.index`` for indexes and collections, ``evaluation.cli``,
``encoder_training.cli``) into the groups made here; a handler is ``args.handler(args)``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from app.cli import index as index_cli
from app.cli import mcp as mcp_cli
from cloze_search.cli import commands as remote_cli
from encoder_training import cli as training_cli
from evaluation import cli as evaluation_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cloze", description="Semantic search with encoders you train.")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups = {"cloze": top}
    for group, help_text in (
        ("train", "tokenizer, pre-training (MLM / ELECTRA), SBERT fine-tuning"),
        ("eval", "STS, BEIR retrieval, masked-token accuracy, LAMA"),
        ("index", "build and update search indexes"),
        ("collection", "create, list, show and delete collections (named indexes, each on one model)"),
        ("documents", "put and get documents of a running service (--url), for quick checks"),
    ):
        sub = top.add_parser(group, help=help_text)
        groups[group] = sub.add_subparsers(dest=f"{group}_command", required=True, metavar="COMMAND")
    _add_serve(top)
    _add_export(top)
    index_cli.register(groups)
    remote_cli.register(top, groups)
    mcp_cli.register(top)
    evaluation_cli.register(groups)
    training_cli.register(groups)
    return parser


def _add_serve(top: argparse._SubParsersAction) -> None:
    serve = top.add_parser("serve", help="run the REST service (settings from CLOZE_* variables)")
    serve.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    serve.add_argument("--workers", type=int, default=1)
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> None:
    from app.service.server import run_server

    run_server(args.host, args.port, args.workers)


def _add_export(top: argparse._SubParsersAction) -> None:
    export = top.add_parser(
        "export",
        help="`cloze export --model DIR --out DIR`: ST folder (or a cross-encoder) + ONNX fp32/int8 + model card; "
        "`cloze export onnx --model DIR`: only the ONNX cache beside the model",
    )
    export.add_argument("target", nargs="?", choices=["onnx"], help="onnx: only export the ONNX cache")
    export.add_argument("--model", default="", help="model folder or hub id (default: bundled model)")
    export.add_argument("--out", help="output folder (full export)")
    export.add_argument(
        "--task",
        choices=["embed", "fill-mask", "rerank"],
        default=None,
        help="for `cloze export onnx`: default rerank for a cross-encoder folder, else embed",
    )
    export.add_argument("--no-scores", action="store_true", help="skip measuring scores for the card")
    export.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> None:
    if args.target == "onnx":
        from encoder_runtime import is_reranker, resolve_model_path
        from encoder_runtime.backends.onnx_export import export_all

        task = args.task or ("rerank" if is_reranker(resolve_model_path(args.model)) else "embed")
        for path in export_all(args.model, task):
            print(path)
        return
    if not args.out:
        raise SystemExit("cloze export: --out is required (or use `cloze export onnx --model DIR`)")
    from encoder_training.export import export_model

    export_model(args.model, args.out, measure_scores=not args.no_scores)


def main(argv: list[str] | None = None) -> None:
    level = os.environ.get("CLOZE_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":  # httpx logs every request at INFO: noise on the stderr of every --url command
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"cloze: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
