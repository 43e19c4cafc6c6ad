"""Which FAISS factory strings a collection may use, and the search parameters each takes.

FAISS builds whatever a factory string names and allocates what it declares: ``IVF4000000,Flat`` costs
hundreds of MiB before a vector is added, ``HNSW1000000`` reserves a million neighbours per vector, and
``NSG64`` cannot take ids at all. So the service accepts a small grammar with bounds instead of any string
FAISS parses (a collection's ``factory``, ``cloze index build --factory``, a restored archive's sidecar):

    Flat | IDMap2,Flat                  exact search
    HNSW<M> | HNSW<M>,Flat              graph search, 4 <= M <= 128 (optionally behind ``IDMap2,``)
    IVF<n>,Flat                         inverted file, 1 <= n <= 65,536 lists
    IVF<n>,PQ<m> | IVF<n>,PQ<m>x<b>     plus product quantisation, m divides the dimension, 4 <= b <= 8

The bounds are the sizes ``vectors.choose_factory`` and the FAISS guidance reach (4 sqrt(N) lists, M of 16 to
64) with headroom: 65,536 lists is what 268 million chunks would get.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_LISTS = 1 << 16
HNSW_M = (4, 128)
PQ_BITS = (4, 8)
MAX_NPROBE = MAX_LISTS
MAX_EF_SEARCH = 4096
MAX_RERANK = 100  # candidates re-scored exactly per result: top_k x this, from SQLite

GRAMMAR = re.compile(
    r"(?:IDMap2,)?Flat"
    r"|(?:IDMap2,)?HNSW(?P<m>\d{1,12})(?:,Flat)?"
    r"|IVF(?P<lists>\d{1,12}),(?:Flat|PQ(?P<pq>\d{1,12})(?:x(?P<bits>\d{1,3}))?)"
)
SHAPES = "Flat, IDMap2,Flat, HNSW<M>, IVF<n>,Flat or IVF<n>,PQ<m>[x<bits>]"


class InvalidFactory(ValueError):
    """A factory string outside the grammar or its bounds; the message names what is wrong."""


def check_factory_string(factory: Any, dimension: int) -> str:
    """``factory`` when it is in the grammar and within its bounds for vectors of ``dimension``."""
    if not isinstance(factory, str):
        raise InvalidFactory(f"the factory is {type(factory).__name__}, not a string ({SHAPES})")
    match = GRAMMAR.fullmatch(factory)
    if match is None:
        raise InvalidFactory(f"{factory[:80]!r} is not one of the factories this service builds: {SHAPES}")
    _within("HNSW M", match["m"], *HNSW_M)
    _within("IVF lists", match["lists"], 1, MAX_LISTS)
    if match["pq"] is not None:
        segments = _within("PQ sub-quantisers", match["pq"], 1, dimension)
        if dimension % segments:
            raise InvalidFactory(f"PQ{segments} must divide the dimension {dimension}")
        _within("PQ bits", match["bits"] or "8", *PQ_BITS)
    return factory


def _within(name: str, value: str | None, low: int, high: int) -> int:
    if value is None:
        return 0
    number = int(value)
    if not low <= number <= high:
        raise InvalidFactory(f"{name} is {number}, outside {low}..{high}")
    return number


def ivf_lists(factory: str) -> int:
    match = GRAMMAR.fullmatch(factory)
    return int(match["lists"]) if match and match["lists"] else 0


# A sidecar's ``params``: each known name, its type and bounds (the service sets nothing else).
PARAMS: dict[str, tuple[int, int]] = {
    "nprobe": (1, MAX_NPROBE),
    "efSearch": (1, MAX_EF_SEARCH),
    "rerank": (1, MAX_RERANK),
}


def check_search_params(params: Any) -> dict[str, int]:
    """Search parameters as a sidecar (``vectors.json``) stores them: known names, integers in bounds."""
    if not isinstance(params, dict):
        raise InvalidFactory(f"search parameters are {type(params).__name__}, not an object")
    for name, value in params.items():
        if name not in PARAMS:
            raise InvalidFactory(f"unknown search parameter {str(name)[:40]!r} (known: {', '.join(PARAMS)})")
        low, high = PARAMS[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidFactory(
                f"search parameter {name} is {str(value)[:40]!r}: an integer in {low}..{high}"
            )
    return params


def probe_shape(factory: str) -> str:
    """The same structure at toy size (at most 2 lists), for a probe add that costs nothing."""
    lists = ivf_lists(factory)
    return factory.replace(f"IVF{lists},", f"IVF{min(lists, 2)},", 1) if lists else factory


def probe_training_size(factory: str) -> int:
    """Vectors a probe trains on: PQ's codebooks need 2^bits points each."""
    match = GRAMMAR.fullmatch(factory)
    bits = int(match["bits"] or 8) if match and match["pq"] else 0
    return max(16, int(math.pow(2, bits)) if bits else 0)
