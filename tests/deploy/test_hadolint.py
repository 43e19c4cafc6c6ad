"""Both Dockerfiles pass hadolint (any finding fails: the default threshold) and keep the image contract."""

from __future__ import annotations

import subprocess

import pytest
import tomllib

from tests.deploy.conftest import REPO, save_artifact, tool


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    path = REPO / "docker" / dockerfile
    result = subprocess.run([tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True)
    report = f"$ hadolint docker/{dockerfile}\n{result.stdout}{result.stderr}exit code {result.returncode}\n"
    save_artifact(f"hadolint-{dockerfile}.txt", report)
    print(report)
    assert result.returncode == 0, report


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_image_contract(dockerfile: str) -> None:
    """Non-root, health-checked on /healthz, `cloze` as entrypoint, multi-stage."""
    text = (REPO / "docker" / dockerfile).read_text()
    assert text.count("\nFROM ") >= 2
    assert "\nUSER 10001:10001\n" in text
    assert "HEALTHCHECK" in text and "/healthz" in text
    assert '\nENTRYPOINT ["cloze"]\n' in text


def test_build_context_is_an_allow_list() -> None:
    """A local .env, keys, indexes or virtualenvs can't reach an image: everything is excluded first."""
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert lines[0] == "*"
    assert "**/.env" in lines


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_the_image_gets_every_package_the_distribution_names(dockerfile: str) -> None:
    """`pip install .` there installs only the packages copied in, and `cloze` imports from several at start
    (cloze_search's --url commands among them): each must be let through .dockerignore and copied."""
    text = (REPO / "docker" / dockerfile).read_text()
    allowed = (REPO / ".dockerignore").read_text().splitlines()
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = [pattern.rstrip("*") for pattern in find["include"]]
    assert [p for p in packages if f"\nCOPY {p} ./{p}\n" not in text or f"!{p}/" not in allowed] == []
