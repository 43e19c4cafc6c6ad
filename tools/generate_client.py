"""Write the parts of the Python client that are derived, not written: ``cloze_search/_async_client.py``
from the blocking ``Client`` in ``cloze_search/client.py``, and ``cloze_search/models.py`` from the service's
OpenAPI schemas (the app built in-process, no server). Qdrant's client makes its async twin the same way.

    python -m tools.generate_client [async|models]          # write them (both without an argument)
    python -m tools.generate_client --check [async|models]  # exit 1 with a diff where a file differs

tests/cloze_search/test_generated.py runs the check, so a hand edit of a generated file, a ``Client`` method
without its twin, or a schema the models no longer match fails the fast suite."""

from __future__ import annotations

import argparse
import ast
import difflib
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLIENT = Path("cloze_search/client.py")
ASYNC_CLIENT = Path("cloze_search/_async_client.py")
MODELS = Path("cloze_search/models.py")
NOTICE = "# Generated from {source} by `python -m tools.generate_client`: do not edit."


class GenerationError(Exception):
    """The source has a shape the generator cannot carry over: change the source, or teach the generator."""


# ---- the async client ----

ASYNC_DOC = """The asyncio twin of ``Client``, generated from it: the same methods and docstrings, awaited;
``list_documents`` is an async iterator. Use it with ``async with`` or ``await client.close()``."""
SYNC_METHODS = {"__init__"}  # every other method of Client becomes ``async def``
METHODS = {"__enter__": "__aenter__", "__exit__": "__aexit__"}
NAMES = {  # names in annotations, expressions and imports
    "Client": "AsyncClient",
    "Iterator": "AsyncIterator",
    "UploadBody": "AsyncUploadBody",
    "time": "asyncio",
}
CALLS = {  # a blocking call -> (its async counterpart, awaited)
    "self._http.request": ("self._http.request", True),
    "self._http.close": ("self._http.aclose", True),
    "self._http.stream": ("self._http.stream", False),  # an async context manager: ``async with``
    "httpx.Client": ("httpx.AsyncClient", False),
    "response.read": ("response.aread", True),
    "response.iter_bytes": ("response.aiter_bytes", False),  # an async iterator: ``async for``
    "time.sleep": ("asyncio.sleep", True),
}
ASYNC_CONTEXTS = {"self._http.stream"}
ASYNC_ITERABLES = {"response.iter_bytes"}


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a name or an attribute chain on one, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def called(node: ast.AST) -> str | None:
    return dotted(node.func) if isinstance(node, ast.Call) else None


class Asyncify(ast.NodeTransformer):
    """One method of ``Client`` made its ``AsyncClient`` counterpart."""

    def __init__(self, awaited_methods: set[str]):
        self.awaited_methods = awaited_methods

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = called(node)
        self.generic_visit(node)
        if name is not None and name.startswith("self.") and name.count(".") == 1:
            method = name.removeprefix("self.")
            if method in self.awaited_methods:
                node.func = ast.Attribute(
                    ast.Name("self", ast.Load()), METHODS.get(method, method), ast.Load()
                )
                return ast.Await(node)
        if name is not None and name.startswith("self._http.") and name not in CALLS:
            raise GenerationError(f"{name}: no async counterpart known; add it to CALLS")
        if name in CALLS:
            replacement, awaited = CALLS[name]
            node.func = ast.parse(replacement, mode="eval").body
            return ast.Await(node) if awaited else node
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(NAMES.get(node.id, node.id), node.ctx)

    def visit_With(self, node: ast.With) -> ast.AST:
        is_async = any(called(item.context_expr) in ASYNC_CONTEXTS for item in node.items)
        self.generic_visit(node)
        return ast.AsyncWith(node.items, node.body, node.type_comment) if is_async else node

    def visit_For(self, node: ast.For) -> ast.AST:
        is_async = called(node.iter) in ASYNC_ITERABLES
        self.generic_visit(node)
        if not is_async:
            return node
        return ast.AsyncFor(node.target, node.iter, node.body, node.orelse, node.type_comment)

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        """``yield from``, which an async generator cannot use, as a loop of yields."""
        self.generic_visit(node)
        if not isinstance(node.value, ast.YieldFrom):
            return node
        item = ast.Name("item", ast.Store())
        body: list[ast.stmt] = [ast.Expr(ast.Yield(ast.Name("item", ast.Load())))]
        return ast.For(item, node.value.value, body, [], None)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.generic_visit(node)
        if node.name in SYNC_METHODS:
            return node
        twin = ast.AsyncFunctionDef(
            METHODS.get(node.name, node.name),
            node.args,
            node.body,
            node.decorator_list,
            node.returns,
            node.type_comment,
        )
        if sys.version_info >= (3, 12):
            twin.type_params = node.type_params
        return twin


def refuse_awaits_in_comprehensions(tree: ast.AST) -> None:
    """An ``await`` inside a comprehension or a lambda would make an async generator the caller never awaits
    (``sum(await ... for ...)``): write that method of ``Client`` as a loop instead."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)):
            if any(isinstance(inner, ast.Await) for inner in ast.walk(node)):
                raise GenerationError(f"line {node.lineno}: an await inside a comprehension; use a loop")


def generate_async(source: str) -> str:
    """``_async_client.py`` from ``client.py``'s text."""
    module = ast.parse(source)
    (client,) = [node for node in module.body if isinstance(node, ast.ClassDef) and node.name == "Client"]
    methods = {node.name for node in client.body if isinstance(node, ast.FunctionDef)}
    transform = Asyncify(methods - SYNC_METHODS)
    body: list[ast.stmt] = []
    for statement in client.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            body.append(ast.Expr(ast.Constant(ASYNC_DOC)))  # the class's docstring
        else:
            body.append(transform.visit(statement))
    twin = ast.ClassDef("AsyncClient", client.bases, client.keywords, body, client.decorator_list)
    if sys.version_info >= (3, 12):
        twin.type_params = []
    imports: list[ast.stmt] = [ast.Import([ast.alias("asyncio")])]
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and node.module != "cloze_search._async_client":
            names = [ast.alias(NAMES.get(a.name, a.name), a.asname) for a in node.names]
            imports.append(ast.ImportFrom(node.module, names, node.level))
        elif isinstance(node, ast.Import):
            imports.append(ast.Import([ast.alias(NAMES.get(a.name, a.name), a.asname) for a in node.names]))
        elif isinstance(node, ast.Assign) and dotted(node.targets[0]) == "T":
            imports.append(node)  # the TypeVar the signatures use
    doc = (
        "The asyncio client, ``AsyncClient``: ``Client`` (client.py) with every request awaited. Public as\n"
        "``cloze_search.AsyncClient`` and ``cloze_search.client.AsyncClient``."
    )
    tree = ast.Module([ast.Expr(ast.Constant(doc)), *imports, twin], [])
    ast.fix_missing_locations(tree)
    refuse_awaits_in_comprehensions(tree)
    text = ast.unparse(tree) + '\n\n__all__ = ["AsyncClient"]\n'
    return NOTICE.format(source=CLIENT) + "\n" + tidy(text, ASYNC_CLIENT)


# ---- the models ----


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the client's class, a public name
    schema: str  # the service's OpenAPI component it is made from
    doc: str = ""  # the class's docstring (else the schema's description)
    extra: str = ""  # methods beyond the fields, as source


SEARCH_RESULTS_EXTRA = '''
    def __iter__(self) -> Iterator[SearchHit]:
        """The hits, best first: ``for hit in client.search(...)``."""
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)
'''

MODEL_SPECS = (
    ModelSpec(
        "Document",
        "DocumentIn",
        "A document to store or one read back. ``vector``: only in a collection of your own vectors.",
    ),
    ModelSpec("Explanation", "SearchExplanation"),
    ModelSpec("SearchHit", "SearchResult", "One hit: a document, its best chunk and its score."),
    ModelSpec(
        "SearchResults",
        "SearchResponse",
        "A search's answer; iterating it (and ``len``) goes over ``results``.",
        SEARCH_RESULTS_EXTRA,
    ),
    ModelSpec("Fusion", "FusionIn"),
    ModelSpec("Rerank", "RerankIn"),
    ModelSpec(
        "Collection", "CollectionOut", "A collection: its model (None: your own vectors), status and counts."
    ),
    ModelSpec("Snapshot", "SnapshotInfo"),
    ModelSpec("Restored", "RestoreResult", "What a restore published: the new version and what it holds."),
    ModelSpec(
        "Job",
        "JobStatus",
        "A rebuild's status; ``progress`` is ``done`` / ``total`` (0 while the job reads its input).",
    ),
    ModelSpec("RerankResult", "RerankResult", "One text's relevance to the query."),
    ModelSpec(
        "Prediction", "Prediction", "One candidate for a mask token: its score, token and filled-in text."
    ),
)
ALIASES = (("Mode", "SearchResponse", "mode"),)  # a named Literal: the enum of one schema's property

MODELS_DOC = """Typed values the client sends and returns, generated from the service's OpenAPI schemas (the
client imports neither the service nor pydantic: ``_model_base``). Answers are read leniently (fields a newer
service adds are ignored), so a client keeps working against a service one version ahead."""
MODELS_IMPORTS = """
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from cloze_search._model_base import Model
"""
SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


class Annotations:
    """OpenAPI schemas as Python annotations, naming the models and aliases generated beside them."""

    def __init__(self, models: dict[str, str], aliases: dict[tuple[Any, ...], str]):
        self.models, self.aliases = models, aliases

    def of(self, schema: dict[str, Any], where: str) -> str:
        if "$ref" in schema:
            target = schema["$ref"].rsplit("/", 1)[-1]
            if target not in self.models:
                raise GenerationError(f"{where}: refers to {target}, which no ModelSpec generates")
            return self.models[target]
        if "anyOf" in schema:
            kinds = [self.of(option, where) for option in schema["anyOf"] if option.get("type") != "null"]
            nullable = len(kinds) < len(schema["anyOf"])
            return " | ".join(kinds + (["None"] if nullable else []))
        if "enum" in schema:
            values = tuple(schema["enum"])
            return self.aliases.get(values) or f"Literal[{', '.join(repr(value) for value in values)}]"
        kind = schema.get("type")
        if kind in SCALARS:
            return SCALARS[kind]
        if kind == "array" and "prefixItems" in schema:
            return f"tuple[{', '.join(self.of(item, where) for item in schema['prefixItems'])}]"
        if kind == "array":
            return f"list[{self.of(schema['items'], where)}]"
        if kind == "object":
            values = schema.get("additionalProperties", True)
            return "dict[str, Any]" if values in (True, {}) else f"dict[str, {self.of(values, where)}]"
        raise GenerationError(f"{where}: no annotation for the schema {schema}")


def default_of(schema: dict[str, Any], where: str) -> str:
    """An optional field's default: the schema's, else None where null is allowed, else an empty container."""
    if "default" in schema:
        value = schema["default"]
        if value in ([], {}):
            return f"field(default_factory={type(value).__name__})"
        if isinstance(value, (list, dict)):
            raise GenerationError(f"{where}: a non-empty default {value!r}")
        return repr(value)
    if any(option.get("type") == "null" for option in schema.get("anyOf", [])):
        return "None"
    if schema.get("type") in ("object", "array"):
        return f"field(default_factory={'dict' if schema['type'] == 'object' else 'list'})"
    raise GenerationError(f"{where}: optional, but no default and no null")


def comment(text: str, indent: str) -> list[str]:
    """A property's description as comment lines above its field."""
    prefix = f"{indent}# "
    return textwrap.wrap(" ".join(text.split()), 108, initial_indent=prefix, subsequent_indent=prefix)


def generate_models(spec: dict[str, Any]) -> str:
    """``models.py`` from the service's OpenAPI document."""
    schemas = spec["components"]["schemas"]
    for model in MODEL_SPECS:
        if model.schema not in schemas:
            raise GenerationError(f"{model.name}: the service has no schema {model.schema}")
    lines = [f'"""{MODELS_DOC}"""', MODELS_IMPORTS]
    aliases: dict[tuple[Any, ...], str] = {}
    for alias, schema_name, prop in ALIASES:
        values = tuple(schemas[schema_name]["properties"][prop]["enum"])
        aliases[values] = alias
        lines.append(f"{alias} = Literal[{', '.join(repr(value) for value in values)}]")
    annotations = Annotations({model.schema: model.name for model in MODEL_SPECS}, aliases)
    for model in MODEL_SPECS:
        schema = schemas[model.schema]
        doc = model.doc or schema.get("description")
        if not doc:
            raise GenerationError(f"{model.name}: neither a ModelSpec doc nor a schema description")
        lines += ["", "", "@dataclass", f"class {model.name}(Model):", f'    """{doc}"""', ""]
        required = schema.get("required", [])
        properties = schema["properties"]
        for name in [*required, *(name for name in properties if name not in required)]:
            prop, where = properties[name], f"{model.schema}.{name}"
            if "description" in prop:
                lines += comment(prop["description"], "    ")
            declaration = f"    {name}: {annotations.of(prop, where)}"
            lines.append(declaration if name in required else f"{declaration} = {default_of(prop, where)}")
        lines.append(model.extra)
    return NOTICE.format(source="the service's OpenAPI schemas") + "\n" + tidy("\n".join(lines), MODELS)


# ---- both ----


def tidy(source: str, path: Path) -> str:
    """Imports sorted and pruned, formatted as ``ruff format`` would: a generated file passes lint as is."""
    ruff = [sys.executable, "-m", "ruff"]
    where = ["--stdin-filename", str(ROOT / path)]
    fixed = run([*ruff, "check", "--fix-only", "--exit-zero", "--select", "I,F401", *where, "-"], source)
    return run([*ruff, "format", *where, "-"], fixed)


def run(command: list[str], stdin: str) -> str:
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise GenerationError(f"{' '.join(command[:4])}: {done.stderr.strip()}")
    return done.stdout


def service_openapi() -> dict[str, Any]:
    """The OpenAPI document of the app ``cloze serve`` runs, built in-process (nothing loaded or served)."""
    from app.service.main import create_app  # the service, only for the models (``async`` needs none of it)
    from app.settings import Settings

    # A fresh Settings, not get_settings()'s cached one: a test that runs the check leaves no settings behind.
    # (mypy runs without pydantic's plugin, so it takes the fields for required arguments.)
    return create_app(Settings()).openapi()  # type: ignore[call-arg]


TARGETS: dict[str, tuple[Path, Callable[[], str]]] = {
    "async": (ASYNC_CLIENT, lambda: generate_async((ROOT / CLIENT).read_text())),
    "models": (MODELS, lambda: generate_models(service_openapi())),
}


def differences(targets: Sequence[str] = tuple(TARGETS)) -> dict[str, str]:
    """Per target whose checked-in file differs from what the generator makes now: the unified diff."""
    found = {}
    for target in targets:
        path, generate = TARGETS[target]
        current = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        wanted = generate()
        if current != wanted:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True), wanted.splitlines(keepends=True), f"{path} (checked in)",
                f"{path} (generated)",
            )  # fmt: skip
            found[target] = "".join(diff)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.generate_client", description=__doc__.split("\n")[0]
    )
    # No ``choices``: argparse refuses an empty list against them (nargs="*"), so they are checked here.
    parser.add_argument("targets", nargs="*", help=f"any of {', '.join(sorted(TARGETS))} (default: all)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 with a diff on a difference"
    )
    args = parser.parse_args(argv)
    targets = args.targets or sorted(TARGETS)
    if unknown := set(targets) - set(TARGETS):
        parser.error(f"no target {', '.join(sorted(unknown))}: choose from {', '.join(sorted(TARGETS))}")
    if args.check:
        found = differences(targets)
        for target, diff in found.items():
            print(f"{TARGETS[target][0]} is out of date: run `python -m tools.generate_client {target}`")
            print(diff)
        return 1 if found else 0
    for target in targets:
        path, generate = TARGETS[target]
        (ROOT / path).write_text(generate())
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
