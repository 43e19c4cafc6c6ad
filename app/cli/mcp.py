"""``cloze mcp``: the MCP server (``app.cli.mcp_server``) beside any deployment. The service's command, not the
client's: it needs the ``mcp`` extra, which ``cloze-client`` (httpx alone) does not carry."""

from __future__ import annotations

import argparse
import os

from cloze_search.cli.commands import DEFAULT_URL


def register(top: argparse._SubParsersAction) -> None:
    mcp = top.add_parser(
        "mcp",
        help="an MCP server on stdio for agents (Claude Desktop, IDEs): search, facets, documents, fill-mask and "
        "collections of a running service (--url) as tools; needs the mcp extra",
    )
    mcp.add_argument(
        "--url",
        default=os.environ.get("CLOZE_URL") or DEFAULT_URL,
        help=f"the service's root URL (default: $CLOZE_URL, else {DEFAULT_URL})",
    )
    mcp.add_argument(
        "--api-key", "--key", dest="api_key",
        help="the key every tool call sends (default: $CLOZE_API_KEY); the service enforces its scope. Not with "
        "--http, where each call carries its caller's own key",
    )  # fmt: skip
    mcp.add_argument("--collection", default="default", help="the collection a tool call naming none reads")
    mcp.add_argument(
        "--http", type=int, metavar="PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio; each call is sent with the "
        "Authorization header its caller sent",
    )  # fmt: skip
    mcp.add_argument("--host", default="127.0.0.1", help="with --http: the address to listen on")
    mcp.set_defaults(handler=_mcp)


def _mcp(args: argparse.Namespace) -> None:
    from cloze_search import Client

    Client(args.url).close()  # a malformed URL stops the start (exit 2, saying why), not the first tool call
    if args.http is not None and args.api_key:
        # A key of its own on a port would lend that key to whoever reaches the port.
        raise SystemExit("cloze mcp: --http passes on each caller's own key; give it no --api-key")
    try:
        from app.cli import mcp_server
    except ModuleNotFoundError as exc:
        if exc.name != "mcp" and not (exc.name or "").startswith("mcp."):
            raise
        raise SystemExit("cloze mcp needs the MCP SDK: pip install 'cloze-search[mcp]'") from exc
    if args.http is not None:
        mcp_server.serve_http(args.url, args.collection, args.host, args.http)
    else:
        mcp_server.serve_stdio(args.url, args.api_key or os.environ.get("CLOZE_API_KEY"), args.collection)
