"""A process heap that is never trimmed, so a step's freed activations are reused rather than faulted in afresh.

Shared by ``benchmarks/pretrain_throughput.py`` (every contender steps on such a heap) and the test that
checks which allocations it keeps.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h


def keep_freed_memory() -> bool:
    """Serve every allocation from a heap that is never trimmed (process-wide); False unless glibc."""
    libc = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    return libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
