"""benchmarks/gpu_run/parts.py: what crosses to and from the GPU machine comes back whole, or is refused by
name (a missing or corrupted part must not become half a model)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parts(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/gpu_run/parts.py", *argv], cwd=ROOT, capture_output=True, text=True
    )


def test_parts_join_back_into_the_same_files_and_refuse_a_bad_part(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    payload = bytes(range(256)) * 9000  # 2.2 MiB: three parts of 1 MiB
    (model / "weights.bin").write_bytes(payload)
    (model / "sub" / "config.json").write_text('{"a": 1}')
    assert (
        parts(
            "split", str(model), "--name", "m", "--part-mib", "1", "--out", str(tmp_path / "out")
        ).returncode
        == 0
    )
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["m.part00", "m.part01", "m.part02", "m.parts.json"]

    half = tmp_path / "elsewhere"  # parts carried in different calls, joined from both folders
    half.mkdir()
    (tmp_path / "out" / "m.part02").rename(half / "m.part02")
    joined = parts("join", str(tmp_path / "out"), str(half), "--name", "m", "--into", str(tmp_path / "back"))
    assert joined.returncode == 0, joined.stderr
    assert (tmp_path / "back" / "model" / "weights.bin").read_bytes() == payload
    assert (tmp_path / "back" / "model" / "sub" / "config.json").read_text() == '{"a": 1}'

    corrupted = bytearray((half / "m.part02").read_bytes())
    corrupted[0] ^= 1
    (half / "m.part02").write_bytes(bytes(corrupted))
    refused = parts(
        "join", str(tmp_path / "out"), str(half), "--name", "m", "--into", str(tmp_path / "again")
    )
    assert refused.returncode != 0 and "m.part02: checksum mismatch" in refused.stderr
    (half / "m.part02").unlink()
    missing = parts("join", str(tmp_path / "out"), "--name", "m", "--into", str(tmp_path / "again"))
    assert missing.returncode != 0 and "m.part02 is missing" in missing.stderr
    assert not (tmp_path / "again" / "model").exists()
