"""The client as a user of the `client` extra gets it: a fresh virtual environment holding only cloze_search (a
wheel built from the source tree) and the extra's requirements, no torch, numpy or service package; it imports
and searches the session's real server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.e2e.conftest import WRITE_KEY

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import importlib.util, json, sys
import cloze_search
missing = [name for name in ("torch", "numpy", "fastapi", "faiss") if importlib.util.find_spec(name) is None]
with cloze_search.Client(sys.argv[1], api_key=sys.argv[2]) as client:
    client.create_collection("venv-check")
    client.upsert([{"id": "venv-1", "text": "a client installed on its own"}], collection="venv-check")
    hits = client.search("installed on its own", collection="venv-check", top_k=1)
ours = sorted(name for name in ("app", "index", "encoder_runtime", "encoder_training") if name in sys.modules)
print(json.dumps({"missing": missing, "loaded": ours, "top": hits.results[0].id, "file": cloze_search.__file__}))
"""


def run(*command: str, cwd: Path) -> str:
    env = {
        key: value for key, value in os.environ.items() if key != "PYTHONPATH"
    }  # no source tree on the path
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_client_extra_alone_imports_and_searches(server, tmp_path):
    # The distribution's metadata and the client's package only: the wheel holds cloze_search and nothing else.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copytree(
        ROOT / "cloze_search", source / "cloze_search", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip"]
    run(
        *pip,
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(tmp_path / "wheels"),
        ".",
        cwd=source,
    )
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path)
    python = str(venv / "bin" / "python")
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "client"
    ]
    (wheel,) = (tmp_path / "wheels").glob("cloze_search-*.whl")
    run(*pip, "--python", python, "install", "-q", "--no-deps", str(wheel), cwd=tmp_path)
    run(*pip, "--python", python, "install", "-q", *requirements, cwd=tmp_path)
    answer = json.loads(run(python, "-c", PROBE, server, WRITE_KEY, cwd=tmp_path))
    assert answer["missing"] == ["torch", "numpy", "fastapi", "faiss"]  # none of them installed there
    assert answer["loaded"] == [] and answer["top"] == "venv-1"
    assert answer["file"].startswith(str(venv))  # the installed copy, not the source tree
