"""Sub-commands of this stage, registered into the groups of ``app.cli``: ``cloze index build|add|delete``.
Heavy imports stay inside the handlers."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
BACKENDS = ["auto", "torch", "onnx", "onnx-int8"]


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    index = groups["index"]
    build = index.add_parser(
        "build", help="build a new index version from a corpus and publish it atomically"
    )
    build.add_argument(
        "--input",
        required=True,
        type=Path,
        help="JSONL (BEIR or plain), CSV/TSV, Parquet, or a folder of .txt/.md",
    )
    build.add_argument("--out", required=True, type=Path, help="index directory")
    _model_args(build)
    build.add_argument("--factory", help="FAISS factory string (default: chosen by corpus size)")
    build.add_argument(
        "--engine", choices=["local", "ray"], default="local", help="where the embedding stage runs"
    )
    build.add_argument("--batch-tokens", type=int, help="padded tokens per encoder batch")
    build.add_argument(
        "--resume", action="store_true", help="continue an interrupted build of the same input and model"
    )
    build.add_argument(
        "--skip-if-current",
        action="store_true",
        help="exit at once if --out already holds this input and model",
    )
    build.add_argument("--no-progress", action="store_true")
    build.set_defaults(handler=_build)

    add = index.add_parser("add", help="add or replace documents in the published index (incremental)")
    add.add_argument("--index", required=True, type=Path)
    add.add_argument("--input", required=True, type=Path)
    _model_args(add)
    add.set_defaults(handler=_add)

    delete = index.add_parser("delete", help="delete documents by id from the published index")
    delete.add_argument("--index", required=True, type=Path)
    delete.add_argument("ids", nargs="+")
    _model_args(delete)
    delete.set_defaults(handler=_delete)


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")


def _encoder(args: argparse.Namespace) -> Any:
    from encoder_runtime import load_encoder

    return load_encoder(args.model or None, backend=args.backend)


def is_current(out: Path, input_path: Path, model: str) -> bool:
    """Published index at ``out`` built from these input bytes and this model (cheap: no model is loaded)."""
    from encoder_runtime.model_dir import ModelInfo, resolve_model_path
    from index.builder import current_manifest, is_built_from

    manifest = current_manifest(out)
    fingerprint = ModelInfo.read(resolve_model_path(model or None)).fingerprint
    return manifest is not None and is_built_from(manifest, input_path, fingerprint)


def _build(args: argparse.Namespace) -> None:
    if args.skip_if_current and is_current(args.out, args.input, args.model):
        print(f"index at {args.out} is current for {args.input}; nothing to do")
        return
    from index.builder import BuildOptions, build_from_input
    from index.layout import BuildInProgress
    from index.records import LiveWritesDuringBuild, StorageError

    options = BuildOptions(
        factory=args.factory,
        engine=args.engine,
        batch_tokens=args.batch_tokens,
        resume=args.resume,
        show_progress=not args.no_progress,
    )
    try:
        manifest = build_from_input(args.out, args.input, _encoder(args), options)
    except StorageError as exc:
        raise SystemExit(
            f"cloze index build: {exc} (the unfinished version stays: --resume continues it)"
        ) from exc
    except (LiveWritesDuringBuild, BuildInProgress) as exc:
        raise SystemExit(f"cloze index build: {exc}") from exc
    print(
        json.dumps(
            {k: manifest[k] for k in ("version", "documents", "chunks", "factory", "model_id", "checksum")}
        )
    )


def _open_writer(args: argparse.Namespace, create: bool) -> Any:
    """The index for writing; a clear exit (not a traceback) when a live service already writes it."""
    from index.layout import WriterLease
    from index.records import IndexLocked
    from index.search_index import SearchIndex

    try:
        probe = WriterLease(args.index)  # before the model loads: a refusal should not take seconds
    except IndexLocked as exc:
        raise SystemExit(f"cloze index: {exc}") from exc
    try:
        return SearchIndex.open(args.index, _encoder(args), create=create)
    finally:
        probe.release()


def _add(args: argparse.Namespace) -> None:
    from itertools import islice

    from index.ingest import iter_documents
    from index.records import StorageError

    index = _open_writer(args, create=True)
    total = 0
    try:
        documents = iter_documents(args.input)
        while batch := list(islice(documents, 256)):
            total += index.upsert(batch)
    except StorageError as exc:
        raise SystemExit(f"cloze index add: {exc} ({total} documents were added before)") from exc
    finally:
        index.close()
    print(json.dumps({"upserted": total} | index.stats()))


def _delete(args: argparse.Namespace) -> None:
    index = _open_writer(args, create=False)
    try:
        deleted = [doc_id for doc_id in args.ids if index.delete(doc_id)]
    finally:
        index.close()
    print(json.dumps({"deleted": deleted, "missing": [d for d in args.ids if d not in deleted]}))
