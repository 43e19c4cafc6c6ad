"""Sub-commands of this stage."""

from __future__ import annotations

import argparse


def register(groups: dict[str, argparse._SubParsersAction]) -> None:
    """Nothing registered yet."""
