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


def test_cli_help_lists_every_stage():
    """That it is instant (no heavy import) is tests/test_layers.py's check, not a clock's."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("train", "eval", "index", "serve", "export", "adapt"):
        assert command in out
