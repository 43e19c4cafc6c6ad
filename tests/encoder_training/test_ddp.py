"""DDP for real: two CPU processes (gloo) under torchrun run a few MLM steps and end with equal weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.servers import free_port


def test_two_process_ddp_replicas_agree(shared_data: Path, tiny_bert: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "wiki.txt"
    corpus.write_text(
        (shared_data / "wikitext-2-raw" / "wiki.valid.raw").read_text(encoding="utf-8")[:120_000]
    )
    out = tmp_path / "ddp"
    bin_dir = Path(sys.executable).parent
    cmd = [
        str(bin_dir / "torchrun"),
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "--no-python",
        str(bin_dir / "cloze"),
        *("train", "pretrain", "--recipe", "tiny-cpu", "--input", str(corpus), "--out", str(out)),
        *("--tokenizer", str(tiny_bert), "--hidden-size=32", "--num-layers=1", "--num-heads=2"),
        *("--intermediate-size=64", "--block-size=32", "--batch-size=4", "--max-steps=4", "--warmup-steps=0"),
        *("--precision=fp32", "--logging-steps=2", "--save-steps=1000"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    digests = [(out / "checkpoints" / f"weights-rank{r}.sha256").read_text() for r in (0, 1)]
    assert digests[0] == digests[1], "DDP replicas diverged"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 4
    assert metrics["tokens_per_s"] > 0
