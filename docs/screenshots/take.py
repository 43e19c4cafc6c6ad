"""The README's playground screenshots, taken from what `make serve` runs: the demo index, the bundled
encoder and the shipped fill-mask model, in Debian's chromium (the e2e tests' screenshots show the tiny
random model instead).

    make demo-index && .venv/bin/python docs/screenshots/take.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from harness.servers import serve_process  # noqa: E402

WIDE = {"width": 1100, "height": 900}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def fill_mask(page, url: str) -> None:
    """The page as a visitor first sees it: its own example sentence, answered."""
    page.goto(url + "/static/fill-mask.html")
    page.locator(".prediction").first.wait_for()
    page.screenshot(path=str(HERE / "fill-mask.png"))


def masking(page, url: str) -> None:
    page.goto(url + "/static/masking.html")
    page.locator("#mk-results *").first.wait_for()
    page.screenshot(path=str(HERE / "masking.png"))


def search(page, url: str) -> None:
    page.goto(url + "/static/search.html")
    page.locator("#f-president").wait_for()
    page.fill("#s-query", "peace and war")
    page.fill("#f-president", "Truman")
    page.click("#s-go")
    page.locator("#s-results li").first.wait_for()
    page.screenshot(path=str(HERE / "search.png"))


def main() -> None:
    from playwright.sync_api import sync_playwright

    index = ROOT / "data" / "demo-index"
    if not index.is_dir():
        raise SystemExit(f"{index} is missing: run `make demo-index` first")
    log = Path(tempfile.gettempdir()) / "cloze-screenshots.log"
    with serve_process({"CLOZE_INDEX": str(index)}, log, drop=("CLOZE_API_KEYS",)) as (url, _):
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=WIDE)
            page.set_default_timeout(60_000)
            for shot in (fill_mask, masking, search):
                shot(page, url)
                print(f"{shot.__name__}: {HERE / (shot.__name__.replace('_', '-') + '.png')}")
            browser.close()


if __name__ == "__main__":
    main()
