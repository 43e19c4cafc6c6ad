"""A heap that is never trimmed (``harness.heap``, the pre-training benchmark's) keeps freed memory: a step's
activations reuse the last step's pages."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A "step" allocates, touches and frees three tensors of MB megabytes; after ten steps (the heap settles:
# glibc's aligned allocations need a little more than the chunk just freed) prints the page faults a step
# takes, with glibc as it comes or after harness.heap's keep_freed_memory().
STEPS = """
import resource, sys, torch
from harness.heap import keep_freed_memory
policy, mb = sys.argv[1], int(sys.argv[2])
if policy == "kept":
    assert keep_freed_memory()
torch.set_num_threads(1)

def step():
    activations = [torch.ones(mb * 2**18) for _ in range(3)]

for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
"""


def faults_per_step(policy: str, megabytes: int) -> int:
    run = [sys.executable, "-c", STEPS, policy, str(megabytes)]
    return int(subprocess.run(run, capture_output=True, text=True, check=True, cwd=ROOT).stdout)


@pytest.mark.parametrize(
    ("megabytes", "policy", "faults_afresh"),
    [
        (64, "glibc", True),  # above glibc's 32 MB mmap ceiling: a mapping of its own each time
        (64, "kept", False),
        (24, "kept", False),
    ],
)
def test_which_steps_fault_their_pages_in_afresh(megabytes: int, policy: str, faults_afresh: bool):
    pages = 3 * megabytes * 2**20 // 4096
    faults = faults_per_step(policy, megabytes)
    assert faults > pages / 2 if faults_afresh else faults < pages / 50
