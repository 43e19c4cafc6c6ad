"""The index stage's sub-commands, registered into the groups of ``app.cli``: ``cloze index build|add|delete``,
``cloze index snapshot|restore`` and ``cloze collection ...`` (which talk to a server through the client).
Heavy imports stay inside the handlers."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from cloze_search.cli import commands as remote
from cloze_search.cli import output
from cloze_search.cli.commands import client_for
from cloze_search.cli.output import add_json_flag, emit

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
    where = build.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="index directory")
    _collection_args(where, build)
    build.add_argument(
        "--model-name",
        default="default",
        help="--collection, when it is made: the name the service serves --model by (CLOZE_MODELS)",
    )
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
    where = add.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path)
    _collection_args(where, add)
    add.add_argument("--input", required=True, type=Path)
    _model_args(add)
    add.set_defaults(handler=_add)

    delete = index.add_parser("delete", help="delete documents by id from the published index")
    where = delete.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path)
    _collection_args(where, delete)
    delete.add_argument("ids", nargs="+")
    _model_args(delete)
    delete.set_defaults(handler=_delete)
    _register_snapshots(index)
    _register_collections(groups["collection"])


def _collection_args(where: argparse._MutuallyExclusiveGroup, parser: argparse.ArgumentParser) -> None:
    where.add_argument(
        "--collection", help="a collection under --root instead of a folder (build creates it when missing)"
    )
    _root_arg(parser)


def _root_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(os.environ.get("CLOZE_COLLECTIONS_DIR") or "data/collections"),
        help="the collections' data root (default: $CLOZE_COLLECTIONS_DIR, else data/collections)",
    )


def _register_collections(collection: argparse._SubParsersAction) -> None:
    """``cloze collection create|list|show|delete``: offline under --root (no service writing there), or
    through a running service with --url."""
    create = collection.add_parser("create", help="create an empty collection on a named model")
    create.add_argument("name")
    remote.collection_options(create)
    _model_args(create)
    handlers = {"list": _collection_list, "show": _collection_show, "delete": _collection_delete}
    for name, text in remote.COLLECTION_COMMANDS.items():
        command = collection.add_parser(name, help=text)
        if name != "list":
            command.add_argument("name")
        _collection_target(command)
        add_json_flag(command)
        command.set_defaults(handler=handlers[name])
    _collection_target(create)
    add_json_flag(create)
    create.set_defaults(handler=_collection_create)


def _collection_target(parser: argparse.ArgumentParser) -> None:
    remote.url_args(parser, default=None)
    _root_arg(parser)


def _collection_create(args: argparse.Namespace) -> None:
    from index.collections import CollectionError, CollectionInfo, create_collection

    options = {
        "factory": args.factory,
        "chunk_window": args.chunk_window,
        "chunk_overlap": args.chunk_overlap,
    }
    if args.url:
        remote.collection_create(args)
        return
    if args.dimension:
        info = CollectionInfo(
            args.name, None, args.factory, dimension=args.dimension, metric=args.metric or "cosine"
        )
    else:
        info = CollectionInfo(args.name, args.model_name, **options)
    try:
        create_collection(args.root, info, info.own_vectors() or _encoder(args))
    except (CollectionError, ValueError) as exc:
        raise SystemExit(f"cloze collection create: {exc}") from exc
    emit(args, _stored_collection(args.root, args.name), output.collection_card)


def _collection_list(args: argparse.Namespace) -> None:
    from index.collections import list_collections

    if args.url:
        remote.collection_list(args)
        return
    collections = [_stored_collection(args.root, info.name) for info in list_collections(args.root)]
    emit(args, {"collections": collections}, lambda answer: output.collection_list(answer["collections"]))


def _collection_show(args: argparse.Namespace) -> None:
    if args.url:
        remote.collection_show(args)
        return
    _existing_collection(args.root, args.name)
    emit(args, _stored_collection(args.root, args.name, detailed=True), output.collection_card)


def _stored_collection(root: Path, name: str, detailed: bool = False) -> Any:
    """A collection on disk described as the service describes it (``GET /collections``, and with
    ``detailed`` ``GET /collections/{name}``): build options from the published version's manifest, the
    live counts (writes since the build included, read as a replica reads), bytes on disk only in detail."""
    from cloze_search import Collection
    from index.collections import disk_usage, folder_of, last_write, read_info
    from index.storage import layout
    from index.storage.store import DocumentStore

    folder = folder_of(root, name)
    info = read_info(folder)
    assert info is not None  # listed, or checked by _existing_collection
    described = Collection(
        name=name, model=info.model, status="ready", dimension=info.dimension, metric=info.metric,
        created=info.created,
    )  # fmt: skip
    version = layout.current_version(folder)
    published = None if version is None else layout.version_dir(folder, version)
    manifest = None if published is None else layout.read_manifest_safely(published)
    if published is None or manifest is None:
        described.status, described.error = "failed", "no published version with a readable manifest"
    else:
        store = DocumentStore(published / layout.STORE, create=False, read_only=True)
        try:
            counts = store.counts()
        finally:
            store.close()
        build = manifest.get("build", {})
        described.version, described.documents, described.chunks = (
            version,
            counts["documents"],
            counts["chunks"],
        )
        described.factory, described.chunk_window = build.get("factory"), build.get("chunk_window")
        described.chunk_overlap = build.get("chunk_overlap")
    if detailed:
        described.bytes_on_disk, described.last_write = disk_usage(folder), last_write(folder)
    return described


def _collection_delete(args: argparse.Namespace) -> None:
    from index.collections import CollectionError, delete_collection
    from index.records import IndexLocked
    from index.storage.layout import WriterLease

    if args.url:
        remote.collection_delete(args)
        return
    folder = _existing_collection(args.root, args.name)
    try:
        lease = WriterLease(folder)  # a service writing it must delete it itself (--url)
    except IndexLocked as exc:
        raise SystemExit(f"cloze collection delete: {exc}; delete it through the service (--url)") from exc
    lease.release()
    try:
        delete_collection(args.root, args.name)
    except CollectionError as exc:
        raise SystemExit(f"cloze collection delete: {exc}") from exc
    emit(args, {"deleted": args.name}, remote.deleted)


def _existing_collection(root: Path, name: str) -> Path:
    from index.collections import CollectionError, folder_of, read_info

    try:
        folder = folder_of(root, name)
    except CollectionError as exc:
        raise SystemExit(f"cloze collection: {exc}") from exc
    if read_info(folder) is None:
        raise SystemExit(f"cloze collection: no collection named {name!r} under {root}")
    return folder


def _collection_folder(args: argparse.Namespace, create: bool = False) -> Path:
    """``--index``/``--out`` as given, or the folder of ``--collection`` (made first when ``create``)."""
    if not args.collection:
        return args.out if hasattr(args, "out") else args.index
    from index.collections import CollectionError, CollectionInfo, create_collection, folder_of, read_info

    try:
        folder = folder_of(args.root, args.collection)
    except CollectionError as exc:
        raise SystemExit(f"cloze index: {exc}") from exc
    info = read_info(folder)
    if info is None:
        if not create:
            raise SystemExit(f"cloze index: no collection named {args.collection!r} under {args.root}")
        model_name = getattr(args, "model_name", "default")
        create_collection(args.root, CollectionInfo(args.collection, model_name), _encoder(args))
    elif info.dimension is not None:
        raise SystemExit(
            f"cloze index: the collection {args.collection!r} holds vectors its callers supply, and this "
            "command embeds text with a model: write it through the service (PUT with a `vector` per document)"
        )
    return folder


def _register_snapshots(index: argparse._SubParsersAction) -> None:
    snapshot = index.add_parser(
        "snapshot",
        help="write a snapshot archive: of an index folder no service is writing (--index), or of a live "
        "service's collection (--url), while it serves",
    )
    _target_args(snapshot)
    snapshot.add_argument("--snapshots-dir", type=Path, help="--index: where archives go (<index>.snapshots)")
    snapshot.add_argument("--compression", choices=["none", "gzip"], default="none", help="--index only")
    snapshot.add_argument("--keep", type=int, help="--index: keep the newest N snapshots (default: all)")
    snapshot.add_argument("--download", type=Path, help="--url: also save the archive to this file")
    snapshot.set_defaults(handler=_snapshot)

    restore = index.add_parser(
        "restore",
        help="verify a snapshot archive and publish it as a new version of the index (offline with --index, "
        "or uploaded to a live service with --url)",
    )
    restore.add_argument("archive", type=Path)
    _target_args(restore, collection_required=True)
    restore.set_defaults(handler=_restore)


def _target_args(parser: argparse.ArgumentParser, collection_required: bool = False) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", type=Path, help="an index folder (no service may be writing it)")
    where.add_argument("--url", help="a running service, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--collection",
        required=collection_required,
        default=None if collection_required else "default",
        help="collection name (`default`: the service's index; with --index, the folder is the collection)",
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("CLOZE_API_KEY"), help="--url: a write key (or CLOZE_API_KEY)"
    )


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")


def _encoder(args: argparse.Namespace) -> Any:
    from encoder_runtime import load_encoder

    return load_encoder(args.model or None, backend=args.backend)


def is_current(out: Path, input_path: Path, model: str) -> bool:
    """Published index at ``out`` built from these input bytes and this model (cheap: no model is loaded)."""
    from encoder_runtime.model_dir import ModelInfo, resolve_model_path
    from index.build.builder import current_manifest, is_built_from

    manifest = current_manifest(out)
    fingerprint = ModelInfo.read(resolve_model_path(model or None)).fingerprint
    return manifest is not None and is_built_from(manifest, input_path, fingerprint)


def _build(args: argparse.Namespace) -> None:
    args.out = _collection_folder(args, create=True)
    if args.skip_if_current and is_current(args.out, args.input, args.model):
        print(f"index at {args.out} is current for {args.input}; nothing to do")
        return
    from index.build.builder import BuildOptions, build_from_input
    from index.records import LiveWritesDuringBuild, StorageError
    from index.storage.layout import BuildInProgress

    options = BuildOptions(
        factory=args.factory or _collection_build(args.out).get("factory"),
        window=_collection_build(args.out).get("chunk_window"),
        overlap=_collection_build(args.out).get("chunk_overlap"),
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


def _collection_build(folder: Path) -> dict[str, Any]:
    """The build options a collection was created with (nothing for a plain index folder)."""
    from dataclasses import asdict

    from index.collections import read_info

    info = read_info(folder)
    return asdict(info) if info is not None else {}


def _open_writer(args: argparse.Namespace, create: bool) -> Any:
    """The index for writing; a clear exit (not a traceback) when a live service already writes it."""
    args.index = _collection_folder(args)
    from index.records import IndexLocked
    from index.search_index import SearchIndex
    from index.storage.layout import WriterLease

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

    from index.build.ingest import iter_documents
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


def _snapshot(args: argparse.Namespace) -> None:
    if args.url:
        with client_for(args) as client:
            entry = client.create_snapshot(collection=args.collection)
            if args.download:
                client.download_snapshot(entry.name, args.download, collection=args.collection)
        _print(entry)
        return
    from index.archive.snapshots import SnapshotError, default_folder, snapshot_offline
    from index.records import IndexLocked

    _offline_collection(args)
    folder = args.snapshots_dir or default_folder(args.index)
    try:
        entry = snapshot_offline(args.index, folder, args.compression, args.keep)
    except (IndexLocked, SnapshotError) as exc:
        raise SystemExit(f"cloze index snapshot: {exc}") from exc
    print(json.dumps(entry | {"path": str(Path(folder) / entry["name"])}))


def _restore(args: argparse.Namespace) -> None:
    if not args.archive.is_file():
        raise SystemExit(f"cloze index restore: no archive at {args.archive}")
    if args.url:
        with client_for(args) as client:
            _print(client.upload_snapshot(args.archive, collection=args.collection))
        return
    from index.archive.restore import read_info, restore_offline
    from index.archive.snapshots import SnapshotError
    from index.build.own_vectors import OwnVectors
    from index.records import DocumentLimits, IndexLocked
    from index.search_index import import_rules
    from index.storage.layout import BuildInProgress

    _offline_collection(args)
    try:
        # No service, so no collection settings: the archive's model says whether its documents need text;
        # the default document limits apply.
        own = OwnVectors.from_fingerprint(str(read_info(args.archive).get("model_fingerprint")))
        result = restore_offline(args.index, args.archive, import_rules(own, DocumentLimits()))
    except (IndexLocked, BuildInProgress, SnapshotError) as exc:
        raise SystemExit(f"cloze index restore: refused, nothing changed: {exc}") from exc
    print(json.dumps(result))


def _offline_collection(args: argparse.Namespace) -> None:
    if args.collection != "default":
        raise SystemExit(
            f"cloze index: --index is one collection's folder; --collection {args.collection!r} applies to "
            "--url only (use `default` or leave it out)"
        )


def _print(answer: Any) -> None:
    from dataclasses import asdict

    print(json.dumps(asdict(answer)))
