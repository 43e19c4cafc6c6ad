"""The README's two commands: ``make serve`` installs what serving needs and no more, ``make test`` the rest.

``make serve`` had installed the test tools and Ray too (a 3.2 GB ``.venv`` to serve). What it installs is read
from ``make -n``; that serving needs nothing more is checked by running what ``make serve`` runs, ``cloze index
build`` then ``cloze serve``, with the modules of the ``dev`` and ``ray`` extras hidden from the process."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import tomllib
from packaging.requirements import Requirement

from harness.servers import serve_process

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def dry_run(target: str, venv: Path, *settings: str) -> list[str]:
    """The extras each ``pip install -e`` line of ``make -n target`` on a fresh checkout names, in order."""
    done = subprocess.run(
        ["make", "-n", target, f"VENV={venv}", *settings],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return re.findall(r'pip install -q -e "\.\[([^\]]*)\]"', done.stdout)


def test_make_serve_installs_what_serving_needs_and_make_test_the_rest(tmp_path):
    fresh = tmp_path / "venv"  # no stamp files: what a fresh clone runs
    assert dry_run("serve", fresh) == ["cpu"]
    assert dry_run("test", fresh) == ["cpu,dev,ray"]
    assert dry_run("test-fast", fresh) == ["cpu,dev,ray"]
    assert dry_run("install", fresh, "EXTRAS=gpu,dev") == [
        "gpu,dev"
    ]  # never beside the cpu extra's onnxruntime


def hidden_modules() -> list[str]:
    """The top-level modules the ``dev`` and ``ray`` extras' distributions bring (those installed here)."""
    wanted = {Requirement(text).name.lower().replace("_", "-") for text in EXTRAS["dev"] + EXTRAS["ray"]}
    served = {Requirement(text).name.lower().replace("_", "-") for text in EXTRAS["cpu"]}
    modules = set()
    for module, distributions in importlib.metadata.packages_distributions().items():
        names = {name.lower().replace("_", "-") for name in distributions}
        if names & wanted and not names & served and module.isidentifier() and not module.startswith("_"):
            modules.add(module)
    return sorted(modules)


HIDE = """
import importlib.abc, importlib.machinery, sys

HIDDEN = frozenset({hidden!r})


class NotInstalled(importlib.abc.MetaPathFinder):
    # The path finder, blind to what `make serve` does not install: as if it were absent.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    def __getattr__(self, name):
        return getattr(importlib.machinery.PathFinder, name)


sys.meta_path[:] = [NotInstalled() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""


@pytest.mark.slow
def test_serving_runs_without_the_test_and_ray_extras(tmp_path):
    """The demo index build and the server, as ``make serve`` runs them, on a small corpus."""
    hidden = hidden_modules()
    assert {"pytest", "hypothesis", "ray", "playwright", "openai", "moto"} <= set(hidden)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(HIDE.format(hidden=hidden)))
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
    }
    probe = subprocess.run(
        [sys.executable, "-c", "import pytest"], env=os.environ | env, capture_output=True, text=True
    )
    assert "No module named 'pytest'" in probe.stderr, probe.stderr  # the hiding works
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"id": "moon", "text": "We choose to go to the moon in this decade."}\n'
        '{"id": "sea", "text": "The sea is wide and the ships sail on."}\n'
    )
    index = tmp_path / "demo-index"
    build = subprocess.run(
        [sys.executable, "-m", "app.cli", "index", "build", "--input", str(corpus), "--out", str(index)],
        env=os.environ | env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    with serve_process(env | {"CLOZE_INDEX": str(index)}, tmp_path / "serve.log") as (url, _):
        hits = httpx.get(f"{url}/search", params={"q": "a man on the moon", "top_k": 1}, timeout=60).json()
    assert hits["results"][0]["id"] == "moon"
