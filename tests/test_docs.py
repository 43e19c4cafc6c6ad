"""The docs are part of the product: the configuration reference is generated from the settings object, the
API reference is checked against the OpenAPI schema, and every link in README and docs/ resolves."""

import re
from pathlib import Path

from fastapi.testclient import TestClient

from app.service.main import create_app
from app.settings import Settings, settings_reference

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIGURATION = ROOT / "docs" / "configuration.md"
API = ROOT / "docs" / "api.md"
PAGES = [ROOT / "README.md", ROOT / "RELIABILITY.md", *sorted((ROOT / "docs").glob("*.md"))]


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


def anchors(page: Path) -> set[str]:
    """The #anchors a Markdown page's headings make (GitHub's rule: lower case, punctuation dropped)."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in page.read_text().splitlines()
        if line.startswith("#")
    }


def test_links_in_readme_and_docs_resolve():
    """Every relative link names a file in the repository, and every #anchor a heading of the page it names."""
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken


def test_readme_stays_a_front_door():
    assert len(README.splitlines()) <= 200, (
        "reference material belongs in docs/ (docs/api.md, docs/training.md)"
    )
    assert "(docs/api.md)" in README


def test_api_reference_lists_exactly_the_routes_the_service_has():
    """docs/api.md's route table against the app's OpenAPI schema, both ways (plus the routes outside it)."""
    app = create_app(Settings())
    schema = {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops}
    rows = re.findall(r"^\| `(GET|POST|PUT|DELETE|PATCH) (/[^`]*)` \|", API.read_text(), re.MULTILINE)
    documented = set(rows)
    assert len(rows) == len(documented), "a route is listed twice"
    assert not schema - documented, f"routes missing from docs/api.md: {sorted(schema - documented)}"
    client = TestClient(
        app, base_url="http://127.0.0.1"
    )  # no lifespan, no model: a route answers, not 404/405
    for method, path in documented - schema:  # routes outside the schema (/metrics)
        assert client.request(method, path).status_code not in (404, 405), (
            f"docs/api.md lists {method} {path}"
        )


def test_readme_has_no_unfilled_placeholders():
    assert "PLACEHOLDER" not in README


def test_cli_help_lists_every_stage():
    """That it is instant (no heavy import) is tests/test_layers.py's check, not a clock's."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in (
        "train",
        "eval",
        "index",
        "collection",
        "search",
        "documents",
        "serve",
        "export",
        "adapt",
    ):
        assert command in out
