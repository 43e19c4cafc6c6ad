"""The README is part of the product: it must match the code."""

from pathlib import Path

from app.settings import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_setting_is_documented():
    missing = [
        f"CLOZE_{name.upper()}" for name in Settings.model_fields if f"`CLOZE_{name.upper()}`" not in README
    ]
    assert not missing, f"README's configuration table lacks {missing}"


def test_readme_has_no_unfilled_placeholders():
    assert "PLACEHOLDER" not in README


def test_cli_help_is_instant_and_lists_every_stage():
    """Instant means no heavy import: the sub-commands import torch, transformers, FAISS and the web stack
    when they run, so ``cloze --help`` loads none of them."""
    import subprocess
    import sys

    probe = (
        "import runpy, sys\n"
        "sys.argv = ['cloze', '--help']\n"
        "try:\n    runpy.run_module('app.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = ('torch', 'transformers', 'faiss', 'onnxruntime', 'fastapi', 'sentence_transformers')\n"
        "print('HEAVY', sorted(name for name in heavy if name in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out, out[-500:]
    for command in ("train", "eval", "index", "serve", "export", "adapt"):
        assert command in out
