"""Readiness follows a probe of every collection's index, ``default`` included (a replica answered 500 to
every filtered search while /readyz said ready)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from app.service.collections import CollectionRegistry
from app.service.engines import Engines
from app.service.lifecycle import Lifecycle
from app.service.metrics import Metrics
from app.service.model_registry import ModelRegistry
from app.settings import Settings
from index.collections import CollectionInfo


class FlakyIndex:
    def __init__(self) -> None:
        self.broken = True

    def probe(self) -> None:
        if self.broken:
            raise sqlite3.DatabaseError("database disk image is malformed")


def test_readiness_follows_the_probe_of_each_collection(tmp_path: Path) -> None:
    default, other = FlakyIndex(), FlakyIndex()
    registry = CollectionRegistry(tmp_path)
    models = ModelRegistry("embedding")
    models.default.runtime = object()
    lifecycle = Lifecycle(registry, models, Settings(index=tmp_path / "idx"), Metrics())
    registry.default.index = default
    registry.collections["legal"] = lifecycle.served(CollectionInfo("legal", "default"))
    registry.collections["legal"].index = other
    engines = Engines(models=models, collections=registry)
    assert engines.ready
    for collection in registry.collections.values():
        asyncio.run(lifecycle.probe(collection))
    assert not engines.ready and "malformed" in (registry.default.error or "")
    assert registry.collections["legal"].status == "failed"
    default.broken = False
    asyncio.run(lifecycle.probe(registry.default))
    assert engines.ready and registry.default.error is None
    assert registry.collections["legal"].status == "failed"  # each collection has its own readiness
