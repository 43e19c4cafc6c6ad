"""The commands that talk to a running service through the Python client, shared by two programs: this package's
``cloze-client`` (httpx alone) and the service's ``cloze`` (``cloze search``, ``cloze documents put|get``, and
``cloze collection ... --url`` beside their offline twins in ``app.cli.index``). Lines to read by default,
``--json`` for scripts; a refusal exits with the service's message and the field it names (``client_for``).
The client is imported in the handlers: ``--help`` loads no httpx."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cloze_search.cli import output
from cloze_search.cli.output import add_json_flag, emit

DEFAULT_URL = "http://127.0.0.1:8000"


def register(top: argparse._SubParsersAction, groups: dict[str, argparse._SubParsersAction]) -> None:
    search = top.add_parser("search", help="search a running service (--url): dense, BM25 or hybrid")
    search.add_argument("query", nargs="?", help="the query text (or --vector, or both for hybrid)")
    _target(search)
    search.add_argument("-k", "--top-k", type=int, default=10, help="hits to answer (default 10)")
    search.add_argument("--offset", type=int, default=0, help="hits to skip first (paging)")
    search.add_argument(
        "--mode", choices=["dense", "bm25", "hybrid"], help="default: hybrid (dense for --vector)"
    )
    search.add_argument(
        "--filter", type=_json_object, help='a metadata filter, JSON: \'{"year": {"$gte": 1960}}\''
    )
    search.add_argument(
        "--vector", type=_json_list, help="a query vector, JSON (collections of your own vectors)"
    )
    search.add_argument("--text", action="store_true", help="each hit's whole document text as well")
    search.set_defaults(handler=_search)

    documents = groups["documents"]
    put = documents.add_parser(
        "put", help="store (or replace) one document, or every line of a JSONL file (--input), by id"
    )
    put.add_argument("id", nargs="?", help="the document's id (without --input)")
    put.add_argument("text", nargs="?", default="", help="its text")
    put.add_argument("--metadata", type=_json_object, help="JSON: '{\"year\": 1962}'")
    put.add_argument("--vector", type=_json_list, help="JSON: its vector (collections of your own vectors)")
    put.add_argument(
        "--input",
        help="JSONL, one document a line as PUT /documents takes it ({id, text, metadata, vector}); - reads stdin",
    )
    _target(put)
    put.set_defaults(handler=_put)

    get = documents.add_parser("get", help="one stored document by id: its metadata and text")
    get.add_argument("id")
    _target(get)
    get.set_defaults(handler=_get)


def _target(parser: argparse.ArgumentParser) -> None:
    url_args(parser, default=os.environ.get("CLOZE_URL") or DEFAULT_URL)
    parser.add_argument("--collection", default="default", help="default: the service's own index")
    add_json_flag(parser)


def url_args(parser: argparse.ArgumentParser, default: str | None) -> None:
    """``--url`` and ``--api-key``; without a ``default`` URL (``cloze collection``) it means work offline."""
    where = f"default: $CLOZE_URL, else {DEFAULT_URL}" if default else "else offline, --root"
    parser.add_argument("--url", default=default, help=f"the service's root URL ({where})")
    parser.add_argument("--api-key", default=os.environ.get("CLOZE_API_KEY"), help="a key (or CLOZE_API_KEY)")


def _json_object(text: str) -> dict[str, Any]:
    value = _json(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _json_list(text: str) -> list[Any]:
    value = _json(text)
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"expected a JSON list, got {text!r}")
    return value


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc


def _search(args: argparse.Namespace) -> None:
    if args.query is None and args.vector is None:
        raise SystemExit(f"{program(args)} search: give a query, --vector, or both")
    with client_for(args) as client:
        results = client.search(
            args.query, collection=args.collection, vector=args.vector, top_k=args.top_k, offset=args.offset,
            mode=args.mode, filter=args.filter, include_text=args.text,
        )  # fmt: skip
    emit(args, results, lambda answer: _hits(answer, args.offset))


def _hits(results: Any, offset: int) -> str:
    """One line a hit (rank, score, id, the best chunk cut to the terminal), its metadata under it."""
    count = len(results.results)
    lines = [f"{count} hit{'s' * (count != 1)} ({results.mode}, {results.took_ms:.0f} ms)"]
    width = shutil.get_terminal_size((100, 24)).columns
    for rank, hit in enumerate(results.results, start=offset + 1):
        head = f"{rank:>3}  {hit.score:.4f}  {hit.id}  "
        lines.append(head + output.one_line(hit.chunk, max(20, width - len(head))))
        if hit.metadata:
            lines.append(" " * 5 + "  ".join(f"{k}={output.shown(v)}" for k, v in hit.metadata.items()))
        if hit.text is not None:
            lines.append(" " * 5 + " ".join(hit.text.split()))
    return "\n".join(lines)


def _put(args: argparse.Namespace) -> None:
    if args.input:
        documents: Iterator[dict[str, Any]] = _jsonl(args.input)
        if args.id or args.metadata or args.vector:
            raise SystemExit(
                f"{program(args)} documents put: --input reads documents from a file; give no id"
            )
    elif args.id:
        one: dict[str, Any] = {"id": args.id, "text": args.text, "metadata": args.metadata or {}}
        documents = iter([one | ({"vector": args.vector} if args.vector is not None else {})])
    else:
        raise SystemExit(f"{program(args)} documents put: give an id and a text, or --input FILE")
    with client_for(args) as client:
        count = client.upsert(documents, collection=args.collection)
    answer = {"upserted": count, "collection": args.collection}
    emit(
        args,
        answer,
        lambda a: f"stored {a['upserted']} document{'s' * (a['upserted'] != 1)} in {a['collection']!r}",
    )


def _jsonl(path: str) -> Iterator[dict[str, Any]]:
    handle = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115 (closed below)
    try:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                document = json.loads(line)
            except ValueError as exc:
                raise SystemExit(f"documents put: {path} line {number}: not JSON: {exc}") from exc
            if not isinstance(document, dict):
                raise SystemExit(f"documents put: {path} line {number}: a document is a JSON object")
            yield document
    finally:
        if handle is not sys.stdin:
            handle.close()


def _get(args: argparse.Namespace) -> None:
    with client_for(args) as client:
        document = client.get_document(args.id, collection=args.collection)
    emit(args, document, _document)


def _document(document: Any) -> str:
    vector = None if document.vector is None else f"{len(document.vector)} numbers"
    head = output.fields({"id": document.id, "metadata": document.metadata or None, "vector": vector})
    return head + ("\n\n" + document.text if document.text else "")


# ---- collections over --url: all of cloze-client's, and the --url half of `cloze collection` ----


# What `collection list|show|delete` do, said once for `cloze-client` and for `cloze` (which adds offline handlers).
COLLECTION_COMMANDS = {
    "list": "the collections: model, status, documents, chunks, factory, chunk window",
    "show": "one collection: what list says, and version, overlap, bytes on disk, last write",
    "delete": "delete a collection and its documents",
}


def register_collections(collection: argparse._SubParsersAction) -> None:
    """``collection list|show|create|delete`` of a running service (``cloze-client``; ``cloze collection`` adds
    an offline side to each and registers its own)."""
    create = collection.add_parser("create", help="create an empty collection on a served model")
    create.add_argument("name")
    collection_options(create)
    create.set_defaults(handler=collection_create)
    handlers = {"list": collection_list, "show": collection_show, "delete": collection_delete}
    for name, text in COLLECTION_COMMANDS.items():
        command = collection.add_parser(name, help=text)
        if name != "list":
            command.add_argument("name")
        command.set_defaults(handler=handlers[name])
    for command in (create, *(collection.choices[name] for name in COLLECTION_COMMANDS)):
        url_args(command, default=os.environ.get("CLOZE_URL") or DEFAULT_URL)
        add_json_flag(command)


def collection_options(create: argparse.ArgumentParser) -> None:
    """What a new collection is built with, the same offline and over ``--url``."""
    create.add_argument(
        "--model-name", default="default", help="the served model's name (CLOZE_MODELS) it is built with"
    )
    create.add_argument("--factory", help="FAISS factory string for its builds (default: chosen by size)")
    create.add_argument("--chunk-window", type=int, help="tokens per chunk (default: the model's window)")
    create.add_argument("--chunk-overlap", type=int, help="tokens neighbouring chunks share")
    create.add_argument(
        "--dimension", type=int, help="instead of a model: a collection of your own vectors of this length"
    )
    create.add_argument("--metric", choices=["cosine", "dot"], help="with --dimension (default cosine)")


def collection_create(args: argparse.Namespace) -> None:
    model = None if args.dimension else args.model_name
    options = {
        "factory": args.factory,
        "chunk_window": args.chunk_window,
        "chunk_overlap": args.chunk_overlap,
    }
    with client_for(args) as client:
        created = client.create_collection(
            args.name, model=model, dimension=args.dimension, metric=args.metric, **options
        )
    emit(args, created, output.collection_card)


def collection_list(args: argparse.Namespace) -> None:
    with client_for(args) as client:
        collections = client.list_collections()
    emit(args, {"collections": collections}, lambda answer: output.collection_list(answer["collections"]))


def collection_show(args: argparse.Namespace) -> None:
    with client_for(args) as client:
        collection = client.get_collection(args.name)
    emit(args, collection, output.collection_card)


def collection_delete(args: argparse.Namespace) -> None:
    with client_for(args) as client:
        emit(args, {"deleted": client.delete_collection(args.name)}, deleted)


def deleted(answer: dict[str, str]) -> str:
    return f"deleted the collection {answer['deleted']!r}"


@contextmanager
def client_for(args: argparse.Namespace) -> Iterator[Any]:
    """The Python client on ``--url`` (no timeout: an upload or a snapshot may take long); a refusal exits
    with the service's message and the field it names."""
    from cloze_search import Client, ClozeError

    try:
        with Client(args.url, api_key=args.api_key, timeout=None) as client:
            yield client
    except ClozeError as exc:
        if not exc.status:  # nothing answered
            raise SystemExit(f"{program(args)}: {exc.message}") from exc
        raise SystemExit(f"{program(args)}: {args.url} answered {exc}") from exc


def program(args: argparse.Namespace) -> str:
    """Which of the two programs runs the command, for its messages."""
    return getattr(args, "program", "cloze")
