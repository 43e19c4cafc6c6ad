"""``cloze mcp``: the service's reads as Model Context Protocol tools, for agents, over stdio (or, with ``--http``,
streamable HTTP; ``Service`` says whose key each call carries).

It is a client of the service, not a part of it: every tool is one request of ``cloze_search.AsyncClient``
with the key ``cloze mcp`` was started with, so it runs beside any deployment and the service alone decides
what that key may read (a key scoped to some collections gets the service's 403 naming them). A refusal of
any kind is answered as a tool error (``isError``) carrying the service's message and the field it names,
for the model to read and correct; the server itself never stops on one. Imported only by the ``cloze mcp``
handler: the SDK takes about a second to import, which no other ``cloze`` command should pay.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Annotated, Any, Literal, TypeVar, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from cloze_search import AsyncClient, ClozeError

T = TypeVar("T")
READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
INSTRUCTIONS = (
    "Semantic search over the collections of a cloze-search service. Call list_collections first to learn "
    "the collections and their sizes; search answers ranked chunks with their document ids and metadata; "
    "get_document reads a whole document by id; facets counts metadata values (useful to write filters)."
)
FILTER_HELP = (
    'A metadata filter in MongoDB\'s JSON shape: {"year": {"$gte": 1960}}, {"tag": {"$in": ["a", "b"]}}, '
    '{"$or": [...]}; operators $eq $ne $gt $gte $lt $lte $in $nin $exists $not $and $or. Dates as ISO-8601 strings.'
)
# Module-level: the SDK reads the tools' (string) annotations in this module's namespace.
Name = Annotated[str, Field(description="The collection (list_collections names them)")]
Filter = Annotated[dict[str, Any] | None, Field(description=FILTER_HELP)]


class Service:
    """Where the tools' requests go and with which key. On stdio, one client with the key ``cloze mcp`` was
    started with, for the server's life. Over HTTP (``per_caller``), each call is sent with the key its caller
    sent to the MCP endpoint (``Authorization: Bearer``), so the service checks every caller's key and scope as
    it checks any client's, and ``cloze mcp`` lends no key of its own to whoever reaches its port."""

    def __init__(self, url: str, api_key: str | None, per_caller: bool):
        self.url, self.api_key, self.per_caller = url, api_key, per_caller
        self.shared: AsyncClient | None = None
        self.key_hint = (
            "send your key to the MCP endpoint as Authorization: Bearer KEY"
            if per_caller
            else "start cloze mcp with a valid --api-key (or CLOZE_API_KEY)"
        )

    @asynccontextmanager
    async def running(self, _server: MCPServer) -> AsyncIterator[Service]:
        # One pooled client for the server's life serves every stdio call.
        async with AsyncClient(self.url, api_key=self.api_key, timeout=60) as shared:
            self.shared = shared
            yield self

    @asynccontextmanager
    async def client(self, ctx: Context) -> AsyncIterator[AsyncClient]:
        if not self.per_caller:
            assert self.shared is not None, "a tool ran outside the server's lifespan"
            yield self.shared
            return
        async with AsyncClient(self.url, api_key=caller_key(ctx.headers), timeout=60) as client:
            yield client


def caller_key(headers: Mapping[str, str] | None) -> str | None:
    """The bearer key an HTTP caller sent (None when none): passed on, checked by the service alone."""
    scheme, _, key = ((headers or {}).get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def build_server(
    url: str, api_key: str | None = None, collection: str = "default", per_caller: bool = False
) -> MCPServer:
    """The tools on a client of ``url``; ``collection`` is the one a tool call that names none reads;
    ``per_caller``: each call with its HTTP caller's key (``Service``)."""
    service = Service(url, api_key, per_caller)
    server = MCPServer("cloze-search", instructions=INSTRUCTIONS, lifespan=service.running)
    for tool in _tools(collection):
        server.add_tool(tool, description=inspect.cleandoc(tool.__doc__ or ""), annotations=READ_ONLY)
    return server


def _tools(default: str) -> list[Any]:
    """The tool functions; their signatures are the tools' input schemas, their docstrings the descriptions.
    ``default`` becomes each ``collection`` argument's default, shown in the schema."""

    async def search(
        ctx: Context,
        query: Annotated[str | None, Field(description="The query text")] = None,
        collection: Name = default,
        mode: Annotated[
            Literal["dense", "bm25", "hybrid"] | None,
            Field(description="dense (by meaning), bm25 (by words) or hybrid (both fused; the default)"),
        ] = None,
        top_k: Annotated[int, Field(description="How many hits", ge=1)] = 10,
        offset: Annotated[int, Field(description="Hits to skip first (paging)", ge=0)] = 0,
        filter: Filter = None,
        include_text: Annotated[bool, Field(description="Each hit's whole document text too")] = False,
        vector: Annotated[
            list[float] | None, Field(description="A query vector (collections of your own vectors)")
        ] = None,
    ) -> dict[str, Any]:
        """Search a collection: the best-matching chunks, each with its document id, score and metadata."""
        if query is None and vector is None:
            raise ToolError("give a query (or a vector)")
        results = await _ask(ctx, lambda client: client.search(
            query, collection=collection, vector=vector, top_k=top_k, offset=offset, mode=mode, filter=filter,
            include_text=include_text,
        ))  # fmt: skip
        return asdict(results)

    async def get_document(
        ctx: Context, id: Annotated[str, Field(description="The document's id")], collection: Name = default
    ) -> dict[str, Any]:
        """One stored document by id: its whole text and metadata."""
        return asdict(await _ask(ctx, lambda client: client.get_document(id, collection=collection)))

    async def facets(
        ctx: Context,
        fields: Annotated[list[str], Field(description="Metadata fields to count", min_length=1)],
        collection: Name = default,
        filter: Filter = None,
        top: Annotated[int, Field(description="Values to answer per field", ge=1)] = 10,
    ) -> dict[str, Any]:
        """Over the documents matching the filter: their total and, per field, its most frequent values with
        document counts, and its least and greatest number and date."""
        return await _ask(
            ctx, lambda client: client.facets(fields, collection=collection, filter=filter, top=top)
        )

    async def fill_mask(
        ctx: Context,
        text: Annotated[
            str, Field(description="A text with one or more [MASK] tokens (the model's mask token)")
        ],
        top_k: Annotated[int, Field(description="Candidates per mask", ge=1)] = 5,
        targets: Annotated[list[str] | None, Field(description="Score only these candidate words")] = None,
        model: Annotated[
            str | None, Field(description="A served fill-mask model (default: the default)")
        ] = None,
    ) -> dict[str, Any]:
        """The served masked-language model's best candidates for each mask token of the text."""
        answer = await _ask(
            ctx, lambda client: client.fill_mask(text, top_k=top_k, targets=targets, model=model)
        )
        return {"masks": [[asdict(p) for p in mask] for mask in answer[0]]}

    async def list_collections(ctx: Context) -> dict[str, Any]:
        """The collections this key may read, each with its model, status and document and chunk counts."""
        collections = await _ask(ctx, lambda client: client.list_collections())
        return {"collections": [asdict(c) for c in collections]}

    return [search, get_document, facets, fill_mask, list_collections]


async def _ask(ctx: Context, request: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """The service's answer to ``request``, or its refusal as a tool error the model can read and act on."""
    service = cast(Service, ctx.request_context.lifespan_context)  # what ``Service.running`` yielded
    try:
        async with service.client(ctx) as client:
            return await request(client)
    except ClozeError as exc:
        raise ToolError(_problem(exc, service.key_hint)) from exc


def _problem(exc: ClozeError, key_hint: str) -> str:
    # The service's message often starts with the field already; name it only where it does not.
    where = f" (field {exc.field})" if exc.field and exc.field not in exc.message else ""
    if not exc.status:
        return f"the service did not answer: {exc.message}"
    if exc.status == 401:
        return f"the service refused the key (401): {exc.message}; {key_hint}"
    if exc.status == 403:
        return f"this key may not do that (403): {exc.message}"
    return f"the service answered {exc.status}: {exc.message}{where}"


def serve_stdio(url: str, api_key: str | None, collection: str) -> None:
    build_server(url, api_key, collection).run("stdio")


def serve_http(url: str, collection: str, host: str, port: int) -> None:
    """Streamable HTTP at ``http://host:port/mcp``, each call with its caller's key. Stateless: any number of
    these (or restarts) can answer a client, since no MCP session state is kept between requests."""
    server = build_server(url, None, collection, per_caller=True)
    server.run("streamable-http", host=host, port=port, stateless_http=True, json_response=True)
