"""The training process keeps freed memory: a step's activations reuse the last step's pages."""

import subprocess
import sys

# Rounds of a "step" that allocates, touches and frees a 64 MB tensor (above glibc's 32 MB mmap ceiling)
# and a smaller one; prints the page faults per round once the heap has settled (a few rounds: glibc's
# aligned allocations need a little more than the chunk just freed, so the heap grows before it is reused).
# With ``keep`` set, keep_freed_memory() runs first.
ROUNDS = """
import resource, sys, torch
from encoder_training.pretraining.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.set_num_threads(1)

def step():
    big, small = torch.ones(16 * 2**20), torch.ones(3 * 2**20)

for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""
PAGES_IN_64_MB = 16 * 2**20 * 4 // 4096


def faults_per_round(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    kept, faults = out.stdout.split()
    return kept, int(faults)


def test_freed_memory_is_reused_instead_of_faulted_in_afresh():
    _, default_faults = faults_per_round("default")
    kept, kept_faults = faults_per_round("keep")
    assert default_faults > PAGES_IN_64_MB / 2  # glibc as it comes: every round maps its pages afresh
    assert kept == "True"
    assert kept_faults < PAGES_IN_64_MB / 50
