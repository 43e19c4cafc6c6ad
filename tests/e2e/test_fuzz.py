"""Schema-driven fuzzing (schemathesis) against the service's own OpenAPI: no request may produce a 5xx."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import WRITE_KEY, running_server

MIN_CASES = 1000


def test_fuzz_finds_no_server_errors(server_env, tmp_path):
    env = {**server_env, "CLOZE_INDEX": str(tmp_path / "idx")}  # its own index: fuzzed writes stay here
    report = tmp_path / "schemathesis.json"
    with running_server(env, tmp_path / "server.log") as url:
        run = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "run",
                f"{url}/openapi.json",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                "80",
                "--seed",
                "20261130",
                "--header",
                f"Authorization: Bearer {WRITE_KEY}",
                "--report-json-path",
                str(report),
                "--workers",
                "2",
                "--request-timeout",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=480,
            cwd=tmp_path,  # schemathesis keeps a cache in the working directory: not in the repo
        )
    summary = json.loads(report.read_text())
    cases = summary["test_cases"]
    print(
        f"schemathesis: {cases['generated']} cases, {cases['with_failures']} with failures"
    )  # for the CI log
    assert run.returncode == 0, run.stdout[-4000:]
    assert cases["generated"] >= MIN_CASES
    assert cases["with_failures"] == 0 and summary["failures"] == [] and summary["errors"] == []
    assert summary["operations"]["tested"] == summary["operations"]["total"] >= 12
