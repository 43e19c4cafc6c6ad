"""Keep freed heap memory in the training process instead of handing it back to the kernel every step.

glibc's malloc serves a large allocation with a fresh mapping (above a threshold that grows to 32 MB)
and trims the top of its heap on free, so a training step, which allocates the same activations every
time, takes many of its pages afresh: one page fault per 4 KB. On the VMs this project was measured on a
fault costs ~10 us, and the tiny-cpu steps took up to 8,000 (MLM) and 40,000 (ELECTRA) of them, 8% and 20%
of the step (``benchmarks/pretrain_throughput.py`` counts them). This is what jemalloc or tcmalloc do for
PyTorch on a CPU, set from Python instead of through ``LD_PRELOAD``.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # malloc.h: free memory at the heap top kept before it is returned
M_MMAP_MAX = -4  # malloc.h: how many allocations may be served by their own mapping
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and never trim it; False where the C library is not glibc.

    Process-wide and for the process's lifetime: the heap stays at its peak, which for a training
    process is the working set it will need again at the next step.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)  # the C library this process already uses
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their mallopt differs or is a no-op
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, _NEVER_TRIM))
