"""``CURRENT.json``: the base a replica copies, which the writer replaces last, conditionally. It is not trusted:
one flipped digit is still valid JSON, and a replica that took it at its word copied the base as another
version and never saw the next write. Its fields must agree with the base key they name (``check_current``)
and with that base's own ``snapshot.json`` (``check_base``)."""

from __future__ import annotations

from typing import Any

from index.replication.bucket import Keys
from index.replication.worker import Stuck

CURRENT_FORMAT = 1
# CURRENT.json's field -> the same figure in the base's snapshot.json (the last two absent before they were
# written: compared when present)
BASE_FIELDS = {
    "version": "version",
    "base_seq": "sequence",
    "documents": "documents",
    "model_fingerprint": "model_fingerprint",
}


class BadCurrent(Stuck):
    """``CURRENT.json`` disagrees with itself or with the base it names: nothing is copied from it (a state a
    replica reports, stale, until the writer replaces it)."""


def check_current(current: dict[str, Any], keys: Keys) -> None:
    """``BadCurrent`` unless its format is known and its base key is the one its epoch, version and
    sequence make."""
    if current.get("format") != CURRENT_FORMAT:
        raise BadCurrent(
            f"{keys.current}: format {current.get('format')!r}, this version reads {CURRENT_FORMAT}"
        )
    try:
        named = keys.base(int(current["epoch"]), int(current["version"]), int(current["base_seq"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadCurrent(f"{keys.current} is damaged: {exc!r}") from exc
    if current.get("base") != named:
        raise BadCurrent(
            f"{keys.current} is damaged: epoch {current['epoch']}, version {current['version']} and sequence "
            f"{current['base_seq']} make the base key {named}, but it names {current.get('base')}"
        )


def check_base(current: dict[str, Any], info: dict[str, Any]) -> None:
    """``BadCurrent`` unless the downloaded base's ``snapshot.json`` (``info``) is what ``current`` says."""
    differ = [
        f"{field} {current[field]!r} where the base says {info.get(name)!r}"
        for field, name in BASE_FIELDS.items()
        if current.get(field) is not None and current[field] != info.get(name)
    ]
    if differ:
        raise BadCurrent(f"CURRENT.json does not match its base {current['base']}: {'; '.join(differ)}")
