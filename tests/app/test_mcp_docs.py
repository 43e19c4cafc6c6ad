"""docs/mcp.md against the code, without a service: its table of tools and arguments against the schemas
`cloze mcp` serves, its client configuration against `cloze mcp`'s parser, and its word that a URL with no
scheme stops the start."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from app.cli import build_parser, main
from app.cli.mcp_server import build_server

DOC = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()


def documented_tools() -> dict[str, set[str]]:
    """The tools table: each row's tool and the `names` of its arguments column (the values in parentheses,
    such as a mode's choices, are not arguments)."""
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", DOC, re.MULTILINE)
    return {
        tool: set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", arguments))) for tool, arguments in rows
    }


def test_the_tools_table_names_every_tool_and_argument_served():
    tools = asyncio.run(build_server("http://127.0.0.1:9").list_tools())  # listing sends no request
    served = {tool.name: set(tool.input_schema["properties"]) for tool in tools}
    assert documented_tools() == served


def test_the_client_configuration_is_what_cloze_mcp_takes():
    config = json.loads(re.search(r"```json\n(.*?)```", DOC, re.DOTALL).group(1))
    entry = config["mcpServers"]["cloze-search"]
    assert Path(entry["command"]).name == "cloze"
    args = build_parser().parse_args(entry["args"])
    assert args.handler.__name__ == "_mcp"
    assert (args.url, args.collection) == ("http://127.0.0.1:8000", "papers")
    # The variable cloze mcp reads its key from; tests/e2e/test_mcp.py starts it with a key given so.
    assert set(entry["env"]) == {"CLOZE_API_KEY"}


def test_the_options_table_is_what_cloze_mcp_takes():
    documented = set(re.findall(r"^\| `(--[\w-]+)`", DOC, re.MULTILINE))
    mcp = build_parser()._subparsers._group_actions[0].choices["mcp"]  # type: ignore[union-attr]
    taken = {option for action in mcp._actions for option in action.option_strings} - {
        "-h",
        "--help",
        "--key",
    }
    assert documented == taken


def test_a_url_with_no_scheme_stops_the_start(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["mcp", "--url", "127.0.0.1:8000"])
    assert stopped.value.code == 2 and "no scheme" in capsys.readouterr().err
