"""Keep freed heap memory in a process instead of handing it back to the kernel after every step.

glibc's malloc gives large allocations their own mapping (above a threshold that adapts up to 32 MB) and
trims the top of its heap on free, so a training step, which allocates the same activations every time,
takes many of its pages afresh: a page fault every 4 KB, ~10 us each on the VMs this was measured on.
``benchmarks/pretrain_throughput.py`` counts them: up to 8,000 per tiny-cpu MLM step and 40,000 per ELECTRA
step with glibc as it comes, 8% and 20% of the step, and for the Hugging Face baseline (134 MB of logits a
step) far more. The benchmark sets this so that it compares compute with compute. The trainer leaves glibc as
it is: single 30-minute tiny-cpu runs disagreed (glibc's defaults 4,048 steps at a 4.5 GB peak; these
settings 4,202 steps, 4.8 GB; heap-only 4,298 steps, 2.9 GB, but 3.2 GB against 2.4 GB for glibc over 500
steps), so no default changes on them. jemalloc through ``LD_PRELOAD`` is the cure where it is installed:
flat at 1.1 GB over 500 steps.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # malloc.h: free memory at the heap top kept before it is returned
M_MMAP_THRESHOLD = -3  # malloc.h: allocations this large or larger get their own mapping
M_MMAP_MAX = -4  # malloc.h: how many allocations may have their own mapping at once
_MMAP_CEILING = 32 * 2**20  # the largest threshold glibc accepts on 64-bit
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int


def keep_freed_memory(heap_only: bool = False) -> bool:
    """Serve allocations below 32 MB from the heap and never trim it; False where the C library is not glibc.

    ``heap_only`` serves larger ones from the heap too, so that no step maps fresh pages at all.
    Process-wide and for the process's lifetime.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)  # the C library this process already uses
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their mallopt differs or is a no-op
        return False
    settings = [(M_MMAP_THRESHOLD, _MMAP_CEILING), (M_TRIM_THRESHOLD, _NEVER_TRIM)]
    settings += [(M_MMAP_MAX, 0)] if heap_only else []
    return all(libc.mallopt(option, value) == 1 for option, value in settings)
