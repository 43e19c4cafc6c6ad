"""Sub-commands of this stage, registered into the groups of ``app.cli``."""

from __future__ import annotations

import argparse


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    """Nothing registered yet."""
