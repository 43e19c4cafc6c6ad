"""``cloze-client``: the commands of ``cloze`` that only talk to a running service, in the client's own
distribution (``pip install cloze-search-client``), so a machine without the service's stack can search, store
and read documents and manage collections. The service's ``cloze`` registers the same commands
(``cloze_search.cli.commands``) beside its offline ones."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from cloze_search.cli import commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cloze-client",
        description="Search, documents and collections of a running cloze-search service.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    parser.set_defaults(program="cloze-client")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups = {}
    for group, help_text in (
        ("documents", "put and get documents"),
        ("collection", "create, list, show and delete collections"),
    ):
        sub = top.add_parser(group, help=help_text)
        groups[group] = sub.add_subparsers(dest=f"{group}_command", required=True, metavar="COMMAND")
    commands.register(top, groups)
    commands.register_collections(groups["collection"])
    return parser


def installed_version() -> str:
    """The version of whichever distribution installed this package: the client's own, or the service's that
    carries it too (one version for both, the service's pyproject.toml)."""
    for distribution in ("cloze-search-client", "cloze-search"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown (not installed)"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except ValueError as exc:  # e.g. a URL without its scheme, said before any request
        print(f"cloze-client: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
