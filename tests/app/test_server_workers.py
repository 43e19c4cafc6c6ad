"""`cloze serve --workers N`: one process writes an index, so several workers need a read-only one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.service.server import MALLOC_ARENAS, check_workers

ROOT = Path(__file__).resolve().parents[2]


def test_several_workers_need_a_read_only_index() -> None:
    with pytest.raises(SystemExit, match="needs a read-only index"):
        check_workers(2, read_only=False)
    check_workers(1, read_only=False)
    check_workers(4, read_only=True)


ARENAS = """
import ctypes, ctypes.util, sys, threading
if sys.argv[1] == "serving":
    from app.service.server import return_freed_memory
    return_freed_memory()
barrier = threading.Barrier(8)
kept = []
def allocate():
    barrier.wait()
    kept.append([bytearray(8192) for _ in range(200)])  # past pymalloc: glibc's malloc, in this thread's arena
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads: thread.start()
for thread in threads: thread.join()
ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


def arenas(mode: str, env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ARENAS, mode], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


def test_serving_caps_glibc_arenas_unless_the_operator_set_them() -> None:
    """Eight threads allocating get an arena each from glibc; a server holds two (its writer's RSS climbed
    ~7 MB a minute in the soak with one per thread), or as many as ``MALLOC_ARENA_MAX`` says."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | {"PYTHONPATH": str(ROOT)}
    assert arenas("plain", env) > MALLOC_ARENAS
    assert arenas("serving", env) == MALLOC_ARENAS
    assert arenas("serving", env | {"MALLOC_ARENA_MAX": "4"}) == 4
