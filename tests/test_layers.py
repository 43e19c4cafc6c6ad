"""The layers hold: import-linter's contracts are kept, and `cloze --help` loads no heavy library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "faiss", "onnxruntime", "fastapi", "sentence_transformers", "mcp")
# httpx is no model stack, but `cloze` and `cloze-client` print their help without it: their --url commands
# (cloze_search.cli) import the client in their handlers.
HELP_FREE = (*HEAVY, "httpx")


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " kept, 0 broken" in done.stdout, done.stdout[-2000:]  # however many contracts pyproject.toml has


def test_cloze_help_loads_no_heavy_module() -> None:
    probe = (
        "import contextlib, io, sys\n"
        "from app.cli import main\n"
        "for argv in (['--help'], ['index', '--help'], ['train', 'pretrain', '--help'], ['eval', '--help'],\n"
        "             ['mcp', '--help'], ['search', '--help'], ['collection', 'list', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        f"print(sorted(m for m in {HELP_FREE!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"`cloze --help` imported {done.stdout.strip()}"
