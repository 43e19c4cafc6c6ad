"""Replication in the service: every collection's shipper (``CLOZE_REPLICATION_ROLE=writer``: ``Writer``) or
follower (``replica``: ``Replica``), one worker thread each, under one watchdog; the registry of collections in
the bucket (``index.replication.registry``), which the writer keeps current and a replica mirrors. The routes
ask it too: ``/readyz`` reports it, writes ask ``admit`` before and ``acknowledge`` after they commit."""

from __future__ import annotations

from typing import Any

from app.service.lifecycle import Lifecycle
from app.service.replication.base import Ack, Replication, Unreplicated
from app.service.replication.replica import Replica
from app.service.replication.writer import Writer
from app.settings import Settings

__all__ = ["Ack", "Replica", "Replication", "Unreplicated", "Writer", "replication_for"]

ROLES: dict[str, type[Replication[Any]]] = {"off": Unreplicated, "writer": Writer, "replica": Replica}


def replication_for(settings: Settings, engines: Any, lifecycle: Lifecycle) -> Replication[Any]:
    """The configured role's replication (``CLOZE_REPLICATION_ROLE``): the one place the role decides."""
    return ROLES[settings.replication_role](settings, engines, lifecycle)
