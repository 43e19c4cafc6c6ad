"""docs/benchmarks.md is what benchmarks/report.py renders from benchmarks/results/ into its template
(benchmarks/report_template.md): nobody edits the page by hand."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmarks_page_is_rendered_from_the_current_results():
    # A subprocess, not an import: tests and benchmarks never import each other (import-linter's contract).
    run = subprocess.run(
        [sys.executable, "benchmarks/report.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
