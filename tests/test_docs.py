"""The docs are part of the product: the configuration reference is generated from the settings object."""

from pathlib import Path

from app.settings import Settings, settings_reference

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIGURATION = ROOT / "docs" / "configuration.md"


def test_configuration_reference_is_current():
    assert CONFIGURATION.read_text() == settings_reference(), (
        "docs/configuration.md is stale: python -m app.settings > docs/configuration.md"
    )


def test_configuration_reference_lists_every_setting():
    page = settings_reference()
    missing = [
        f"CLOZE_{name.upper()}" for name in Settings.model_fields if f"`CLOZE_{name.upper()}`" not in page
    ]
    assert not missing


def test_readme_links_the_configuration_reference():
    assert "(docs/configuration.md)" in README


def test_readme_links_resolve():
    """Every relative link names a file in the repository, and every #anchor a heading of README itself."""
    import re

    headings = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in README.splitlines()
        if line.startswith("#")
    }
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if target.startswith(("http://", "https://")):
            continue
        if target.startswith("#"):
            assert target[1:] in headings, target
        else:
            assert (ROOT / target.split("#")[0]).exists(), target


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
