"""The HTTP benchmark's readings of the server: CPU samples by thread and library, and texts per pass."""

from benchmarks.http_throughput import batch_totals, cpu_profile

PERF_SCRIPT = """\
   100      7f69035e82 (/venv/lib/python3.11/site-packages/onnxruntime/capi/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so)
   100      55d0a1b2c3 (/usr/lib/libpython3.11.so.1.0)
   100      55d0a1b2c4 (/usr/lib/libpython3.11.so.1.0)
   100  ffffffff8100 ([kernel.kallsyms])
   101      7f69035e82 (/venv/lib/python3.11/site-packages/onnxruntime/capi/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so)
"""


def test_cpu_samples_split_the_event_loop_from_the_other_threads_by_library():
    profile = cpu_profile(PERF_SCRIPT, pid=100)
    assert profile["event_loop"]["samples"] == 4
    assert profile["event_loop"]["share_by_library"] == {
        "libpython3.11.so.1.0": 0.5,
        "onnxruntime_pybind11_state": 0.25,
        "[kernel.kallsyms]": 0.25,
    }
    assert profile["other_threads"] == {"samples": 1, "share_by_library": {"onnxruntime_pybind11_state": 1.0}}


def test_texts_per_pass_come_from_the_embed_batchers_histogram_only():
    exposition = """\
cloze_batch_size_sum{batcher="fill-mask"} 7.0
cloze_batch_size_count{batcher="fill-mask"} 7.0
cloze_batch_size_sum{batcher="embed"} 110.0
cloze_batch_size_count{batcher="embed"} 20.0
"""
    assert batch_totals(exposition) == (110.0, 20.0)
    assert batch_totals("") == (0.0, 0.0)
