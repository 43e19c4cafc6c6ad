"""/readyz follows a probe of the index (issue 42: a replica answered 500 to every filtered search while
/readyz said ready)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from app.service.engines import Engines, probe_index
from app.settings import Settings


class FlakyIndex:
    def __init__(self) -> None:
        self.broken = True

    def probe(self) -> None:
        if self.broken:
            raise sqlite3.DatabaseError("database disk image is malformed")


def test_readiness_follows_the_index_probe(tmp_path: Path) -> None:
    index = FlakyIndex()
    engines = Engines(encoder=object(), index=index)  # type: ignore[arg-type]
    settings = Settings(index=tmp_path / "idx")
    assert engines.ready
    asyncio.run(probe_index(engines, settings))
    assert not engines.ready and "malformed" in (engines.index_error or "")
    index.broken = False
    asyncio.run(probe_index(engines, settings))
    assert engines.ready and engines.index_error is None
