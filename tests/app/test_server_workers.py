"""`cloze serve --workers N`: one process writes an index, so several workers need a read-only one."""

from __future__ import annotations

import pytest

from app.service.server import check_workers


def test_several_workers_need_a_read_only_index() -> None:
    with pytest.raises(SystemExit, match="needs a read-only index"):
        check_workers(2, read_only=False)
    check_workers(1, read_only=False)
    check_workers(4, read_only=True)
