"""The crash suite: a real `cloze serve` SIGKILLed at named points, second writers, damaged files and a
full disk; after each, a restart and one checker (see ``tests/e2e/crashes.py``). 0 lost is the bar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.crashes import Chain, mount_tmpfs, run_all, unmount


@pytest.mark.slow
def test_every_acknowledged_write_survives_crashes_second_writers_and_a_full_disk(
    tmp_path: Path, tiny_bert: Path
) -> None:
    disk = tmp_path / "disk"
    mount_tmpfs(disk, 24)
    chain = Chain(root=disk / "idx", model=tiny_bert, work=tmp_path)
    try:
        results = run_all(chain, stream_acks=30, batch=4, pointer_damage=("garbled",))
    finally:
        if chain.server is not None:
            chain.server.kill()
        unmount(disk)
    (tmp_path / "crashes.json").write_text(json.dumps(results, indent=2))
    assert len(results) == 8
    assert all(row["lost"] == 0 and row["vectors"] == row["chunks"] for row in results), results
