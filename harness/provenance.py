"""What every result file records about how it was made: the command that ran, and how loaded the machine was.

The command is read from ``sys.argv`` rather than spelled out in each script, so a run with options records
them (several scripts used to write their bare name whatever they were given)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def command() -> str:
    """This process's command line as typed from the repository root: ``python benchmarks/x.py --opt v``."""
    script = Path(sys.argv[0]).resolve()
    if script.is_relative_to(ROOT):
        script = script.relative_to(ROOT)
    return shlex.join(["python", str(script), *sys.argv[1:]])


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages; above the core count, other work shared the CPU."""
    return [round(x, 2) for x in os.getloadavg()]
