"""The client as its own distribution, as a user gets it: both wheels built from the source tree (the service's,
``pyproject.toml``; the client's, ``client/pyproject.toml``), the client's installed with its requirements from
the package index into a bare virtual environment, then the session's real server driven from there by the
library and by its ``cloze-client`` command, with no model stack, web framework or service package findable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import tomllib

from tests.e2e.conftest import WRITE_KEY

ROOT = Path(__file__).resolve().parents[2]
# What the client must install without: the model stack, the web framework, the service's own packages, and
# what only the service needs (tqdm is no longer the client's either).
ABSENT = ("torch", "numpy", "fastapi", "faiss", "yaml", "pydantic", "pydantic_settings", "tqdm", "app", "index",
          "encoder_runtime", "encoder_training", "evaluation")  # fmt: skip
PROBE = """
import importlib.util, json, sys
import cloze_search
with cloze_search.Client(sys.argv[1], api_key=sys.argv[2]) as client:
    client.create_collection("wheel-check")
    client.upsert([{"id": "wheel-1", "text": "a client installed on its own"}], collection="wheel-check")
    hits = client.search("installed on its own", collection="wheel-check", top_k=1)
    names = [c.name for c in client.list_collections()]
findable = [name for name in sys.argv[3:] if importlib.util.find_spec(name) is not None]
print(json.dumps({"findable": findable, "top": hits.results[0].id, "listed": "wheel-check" in names,
                  "file": cloze_search.__file__}))
"""

pytestmark = pytest.mark.slow


def run(*command: str | Path, cwd: Path) -> str:
    # No source tree on the path: what runs is what was installed.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def checkout_copy(target: Path) -> Path:
    """The files a fresh clone has (tracked, and new ones git does not ignore), so a build writes its
    build/ and egg-info there, not into the working tree."""
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet committed is still listed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Both wheels, built as a user would: ``pip wheel`` of the checkout and of its client/ folder (the
    client's build backend, hatchling, fetched into an isolated build environment)."""
    work = tmp_path_factory.mktemp("wheels")
    source = checkout_copy(work / "source")
    out = work / "out"
    pip = (sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out)
    run(*pip, "--no-build-isolation", ".", cwd=source)  # the service: setuptools, already in this environment
    run(*pip, "./client", cwd=source)
    (service,) = out.glob("cloze_search-*.whl")
    (client,) = out.glob("cloze_search_client-*.whl")
    return {"service": service, "client": client}


def metadata(wheel: Path) -> tuple[dict[str, str], list[str]]:
    """The wheel's METADATA headers, and its Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(name).decode())
    return dict(message.items()), message.get_all("Requires-Dist") or []


def package_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n) for n in archive.namelist() if n.startswith("cloze_search/")}


def test_the_two_wheels_carry_one_client_at_one_version(wheels):
    client_meta, client_requires = metadata(wheels["client"])
    service_meta, _ = metadata(wheels["service"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert client_meta["Name"] == "cloze-search-client" and client_meta["Version"] == version
    assert service_meta["Version"] == version
    # httpx alone; the stores' libraries only under their extras.
    assert [r for r in client_requires if "extra ==" not in r] == ["httpx>=0.27"]
    extras = {
        r.split(";")[0].strip(): r.split("extra ==")[1].strip().strip("'\"") for r in client_requires[1:]
    }
    assert extras == {"langchain-core>=1.0": "langchain", "llama-index-core>=0.14": "llama-index"}
    with zipfile.ZipFile(wheels["client"]) as archive:
        entry_points = next(n for n in archive.namelist() if n.endswith("entry_points.txt"))
        assert "cloze-client = cloze_search.cli:main" in archive.read(entry_points).decode()
    # The same package, file for file, in both: the client's wheel copies nothing of its own.
    assert package_files(wheels["client"]) == package_files(wheels["service"])
    sources = {
        f"cloze_search/{p.relative_to(ROOT / 'cloze_search')}" for p in (ROOT / "cloze_search").rglob("*.py")
    }
    assert set(package_files(wheels["client"])) == sources


@pytest.fixture(scope="module")
def bare_venv(wheels, tmp_path_factory) -> Path:
    """A fresh virtual environment holding the client's wheel and what pip resolves for it from the index."""
    venv = tmp_path_factory.mktemp("client-venv") / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=venv.parent)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheels["client"], cwd=venv.parent)
    return venv


def test_the_client_wheel_alone_imports_and_searches(server, bare_venv):
    python = bare_venv / "bin" / "python"
    answer = json.loads(run(python, "-c", PROBE, server, WRITE_KEY, *ABSENT, cwd=bare_venv))
    assert answer["findable"] == []  # none of them installed there
    assert answer["top"] == "wheel-1" and answer["listed"]
    assert answer["file"].startswith(str(bare_venv))  # the installed copy, not the source tree


def test_cloze_client_drives_the_server(server, bare_venv, tmp_path):
    """The installed script: collections, documents put and get, search, for people and with --json."""

    def cloze_client(*args: str) -> str:
        return run(bare_venv / "bin" / "cloze-client", *args, cwd=tmp_path)

    url = ["--url", server, "--api-key", WRITE_KEY]
    target = [*url, "--collection", "wheel-cli"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cloze_client("--version").split() == ["cloze-client", version]
    made = json.loads(cloze_client("collection", "create", "wheel-cli", *url, "--json"))
    assert made["name"] == "wheel-cli" and made["model"] == "default"
    stored = cloze_client("documents", "put", "kestrel", "Kestrels hover over fields hunting voles.",
                          "--metadata", '{"kind": "bird"}', *target)  # fmt: skip
    assert stored.strip() == "stored 1 document in 'wheel-cli'"
    lines = tmp_path / "more.jsonl"
    lines.write_text(
        json.dumps({"id": "trout", "text": "Trout swim up cold rivers.", "metadata": {"kind": "fish"}})
    )
    assert (
        json.loads(cloze_client("documents", "put", "--input", str(lines), *target, "--json"))["upserted"]
        == 1
    )
    assert json.loads(cloze_client("documents", "get", "trout", *target, "--json"))["metadata"] == {
        "kind": "fish"
    }
    assert cloze_client("documents", "get", "kestrel", *target).rstrip().endswith("hunting voles.")
    found = cloze_client("search", "birds hunting voles", "-k", "1", *target).splitlines()
    assert found[0].startswith("1 hit (hybrid, ") and found[1].split()[2] == "kestrel"
    answer = json.loads(cloze_client("search", "cold rivers", "--mode", "bm25", *target, "--json"))
    assert [hit["id"] for hit in answer["results"]] == ["trout"]
    listed = cloze_client("collection", "list", *url)
    assert listed.splitlines()[0].split()[:3] == ["NAME", "MODEL", "STATUS"] and "wheel-cli" in listed
    shown = json.loads(cloze_client("collection", "show", "wheel-cli", *url, "--json"))
    assert shown["documents"] == 2 and shown["bytes_on_disk"] > 0
    missing = refused(bare_venv, "documents", "get", "nobody", *target)
    assert missing.startswith("cloze-client: ") and "404" in missing and "nobody" in missing, missing
    deleted = json.loads(cloze_client("collection", "delete", "wheel-cli", *url, "--json"))
    assert deleted == {"deleted": "wheel-cli"}
    no_scheme = refused(bare_venv, "collection", "list", "--url", server.removeprefix("http://"))
    assert no_scheme.startswith("cloze-client: error: ") and "http://" in no_scheme, no_scheme


def refused(venv: Path, *args: str) -> str:
    """The stderr of a ``cloze-client`` command that must fail: one line saying why, no traceback."""
    done = subprocess.run(
        [str(venv / "bin" / "cloze-client"), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip()
