"""benchmarks/gpu.py runs where there is no GPU: it says so, fills the device part, and exits 0.

The GPU machine runs it once (issue 49); this keeps its CPU path working until then. No timing is asserted.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # whole-model exports, Ray, subprocess kills or real data: make test, not test-fast
def test_the_gpu_benchmark_reports_no_cuda_and_the_device_it_chose(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["cuda"] is False
    assert result["command"].startswith("python benchmarks/gpu.py --quick")
    device = result["parts"]["device"]
    assert "error" not in device, device
    assert device["selection"]["CLOZE_DEVICE unset"]["device"] == "cpu"
    assert device["selection"]["CLOZE_DEVICE=auto"]["device"] == "cpu"
    assert device["onnx_int8"]["session_providers"][0] == "CPUExecutionProvider"
    assert device["torch"]["dtype"] == "torch.float32"
    embed = result["parts"]["embed"]
    assert embed["cpu_onnx_int8"]["sentences_per_s"] > 0
    assert embed["cuda_torch_fp16"] == {"skipped": "no CUDA"}
    for part in ("http", "pretrain", "adapt"):
        assert result["parts"][part]["skipped"] == "no CUDA"
