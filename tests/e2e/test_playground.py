"""The playground pages in a real browser (Debian chromium via Playwright) against the real e2e server.

Every assertion compares what the page shows with what the API answers for the same input, so the
tests hold for any fill-mask model (the e2e server runs the tiny random one).
Screenshots land in ``test-artifacts/playground/``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import READ_KEY

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "playground"
DEMO = ROOT / "app" / "demo" / "corpus.jsonl.gz"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDE, PHONE = {"width": 1100, "height": 900}, {"width": 390, "height": 844}
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Fails, never skips, without chromium: the browser tests are part of the contract."""
    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: run `make browser` (apt-get install -y chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def demo_slice(client) -> list[dict]:
    """A spread of presidents and both kinds of address, so filters have something to choose from."""
    with gzip.open(DEMO, "rt") as handle:
        records = [json.loads(line) for line in handle]
    unique = list({r["id"]: r for r in records}.values())[60::120]  # after the 60 test_search_api loads
    docs = [
        {
            "id": r["id"],
            "text": r["text"],
            "metadata": {k: r[k] for k in ("president", "year", "title", "kind")},
        }
        for r in unique
    ]
    reply = client.put("/documents", json=docs)
    assert reply.status_code == 200, reply.text
    return docs


def open_page(browser, url: str, viewport: dict, key: str | None = READ_KEY):
    """A fresh context (fresh localStorage) with the read key saved as a user would paste it."""
    context = browser.new_context(viewport=viewport)
    if key:
        context.add_init_script(f"localStorage.setItem('cloze.apiKey', {json.dumps(key)})")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    return page, errors


def shoot(page, name: str, full_page: bool = False) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def assert_fits_phone(page) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{page.url} scrolls sideways by {overflow}px at phone width"


def test_home_links_each_page_and_fits_a_phone(browser, server):
    page, errors = open_page(browser, server + "/", PHONE)
    cards = page.locator("a.card")
    assert cards.count() == 3
    hrefs = [cards.nth(i).get_attribute("href") for i in range(3)]
    assert hrefs == ["/static/fill-mask.html", "/static/masking.html", "/static/search.html"]
    for href in hrefs:
        assert page.request.get(server + href).ok
    assert_fits_phone(page)
    assert errors == []
    page.context.close()


def test_without_a_key_the_page_asks_for_one(browser, server):
    page, errors = open_page(browser, server + "/static/fill-mask.html", WIDE, key=None)
    page.locator("#fm-status.error").wait_for()
    assert "API key" in page.locator("#fm-status").inner_text()
    page.locator("summary", has_text="API key").click()
    page.fill("#api-key", READ_KEY)
    page.press("#api-key", "Enter")  # saved, and the page asks again with it
    page.locator(".prediction").first.wait_for()
    assert page.evaluate("localStorage.getItem('cloze.apiKey')") == READ_KEY
    assert errors == []
    page.context.close()


def test_fill_mask_shows_the_models_top_predictions_as_bars(browser, server, client):
    page, errors = open_page(browser, server + "/static/fill-mask.html", WIDE)
    sentence = "the cat sat on the [MASK] in paris ."
    page.fill("#fm-text", "")
    page.type("#fm-text", sentence, delay=5)  # typed, so the debounce sees a burst of input events
    expected = client.post("/fill-mask", json={"inputs": sentence, "parameters": {"top_k": 5}}).json()[0]
    preview = sentence.replace("[MASK]", expected["token_str"])  # the sentence, its top prediction in place
    page.locator(".preview-sentence", has_text=preview).wait_for()  # this sentence's answer
    first = page.locator(".prediction").first
    buttons = page.locator(".mask-result .prediction")
    assert buttons.count() == 5
    assert first.locator(".token").inner_text() == expected["token_str"]
    assert first.locator(".prob").inner_text() == f"{expected['score'] * 100:.1f}%"
    widths = [buttons.nth(i).locator(".bar-fill").evaluate("e => e.style.width") for i in range(5)]
    assert float(widths[0][:-1]) == pytest.approx(expected["score"] * 100, abs=0.01)  # the probability
    assert [float(w[:-1]) for w in widths] == sorted((float(w[:-1]) for w in widths), reverse=True)
    shoot(page, "fill-mask")

    second = buttons.nth(1).get_attribute("data-token")
    buttons.nth(1).focus()
    page.keyboard.press("Enter")  # keyboard use: a prediction is a button
    assert page.input_value("#fm-text") == sentence.replace("[MASK]", second)
    page.locator("#fm-status", has_text="No [MASK]").wait_for()

    page.click("#fm-insert")
    assert page.input_value("#fm-text").count("[MASK]") == 1
    page.locator(".prediction").first.wait_for()

    page.fill("#fm-text", "the cat " * 40 + "[MASK] .")  # past the tiny model's 64-token window
    page.locator("#fm-status.error", has_text="Too long").wait_for()
    assert errors == []
    page.context.close()


def test_fill_mask_answers_each_of_several_masks(browser, server, client):
    """Several masks: the API answers a list per mask (the pipeline's shape); the page shows a panel each."""
    page, errors = open_page(browser, server + "/static/fill-mask.html", WIDE)
    sentence = "the [MASK] sat on the [MASK] ."
    page.fill("#fm-text", sentence)
    page.locator(".mask-result[data-mask='1'] .prediction").first.wait_for()
    top_k = int(page.input_value("#fm-topk"))
    expected = client.post("/fill-mask", json={"inputs": sentence, "parameters": {"top_k": top_k}}).json()
    assert page.locator(".mask-result").count() == len(expected) == 2
    for position, predictions in enumerate(expected):
        panel = page.locator(f".mask-result[data-mask='{position}']")
        assert panel.locator(".prediction .token").all_inner_texts() == [p["token_str"] for p in predictions]
    previews = page.locator(".preview-sentence").all_inner_texts()
    assert previews[0] == f"the {expected[0][0]['token_str']} sat on the [MASK] ."
    assert previews[1] == f"the [MASK] sat on the {expected[1][0]['token_str']} ."
    assert errors == []
    page.context.close()


def test_mask_preview_is_the_training_codes_mask_tokens(client, tiny_bert):
    """The endpoint adds nothing of its own: same tokenizer, seed and config give mask_tokens' own output."""
    import torch
    from transformers import AutoTokenizer

    from encoder_training.masking import MaskingConfig, continuation_table, mask_tokens

    sentence = "the queen reads long books and plays music in paris ."
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    ids = tokenizer(sentence)["input_ids"]
    for strategy in ("token", "whole_word", "span"):
        inputs, labels = mask_tokens(
            torch.tensor([ids]),
            mask_token_id=tokenizer.mask_token_id,
            vocab_size=len(tokenizer),
            special_ids=tokenizer.all_special_ids,
            config=MaskingConfig(strategy=strategy, rate=0.5),
            continuation=continuation_table(tokenizer.get_vocab(), len(tokenizer)),
            generator=torch.Generator().manual_seed(11),
        )
        reply = client.post(
            "/mask-preview", json={"text": sentence, "strategy": strategy, "rate": 0.5, "seed": 11}
        )
        assert reply.status_code == 200, reply.text
        tokens = reply.json()["tokens"]
        assert [t["id"] for t in tokens] == ids
        assert [t["selected"] for t in tokens] == (labels[0] != -100).tolist()
        assert [t["replacement"] for t in tokens] == tokenizer.convert_ids_to_tokens(inputs[0].tolist())
        assert reply.json()["counts"]["selected"] == int((labels != -100).sum()) > 0
    bad = client.post("/mask-preview", json={"text": sentence, "strategy": "random", "rate": 0.5})
    assert bad.status_code == 422 and bad.json()["field"] == "strategy"
    assert client.post("/mask-preview", json={"text": sentence, "rate": 1.0}).status_code == 422


def test_masking_explorer_marks_what_mask_tokens_did(browser, server, client):
    sentence = "the king plays guitar and reads long words in paris ."
    page, errors = open_page(browser, server + "/static/masking.html", WIDE)
    page.fill("#mk-text", sentence)
    page.fill("#mk-seed", "7")
    page.eval_on_selector("#mk-rate", "e => { e.value = '0.4'; e.dispatchEvent(new Event('input')); }")
    page.click("button[type=submit]")
    page.locator("#mk-status", has_text="seed 7").wait_for()
    for strategy in ("token", "whole_word", "span"):
        expected = client.post(
            "/mask-preview", json={"text": sentence, "strategy": strategy, "rate": 0.4, "seed": 7}
        ).json()
        panel = page.locator(f'section[data-strategy="{strategy}"]')
        chips = panel.locator("li.tok")
        assert chips.count() == expected["counts"]["tokens"] == 14  # [CLS] + 12 pieces + [SEP]
        shown = [chips.nth(i).get_attribute("data-action") for i in range(chips.count())]
        assert shown == [t["action"] for t in expected["tokens"]]
        assert expected["counts"]["selected"] > 0
        assert panel.locator('li.tok[data-action="mask"]').count() == expected["counts"]["mask"]
        assert [chips.nth(i).locator(".was").inner_text() for i in range(chips.count())] == [
            t["token"] for t in expected["tokens"]
        ]
    words = page.locator('section[data-strategy="whole_word"] li.tok')
    assert words.nth(7).inner_text().startswith("##s")  # "reads" is read + ##s: one word, one decision
    assert words.nth(6).get_attribute("data-selected") == words.nth(7).get_attribute("data-selected")
    shoot(page, "masking", full_page=True)
    assert errors == []
    page.context.close()


def test_search_shows_scored_highlighted_results_and_filters(browser, server, client, demo_slice):
    page, errors = open_page(browser, server + "/static/search.html", WIDE)
    page.locator("#s-filters:not([hidden])").wait_for()
    labels = page.locator("#s-filter-fields label").all_inner_texts()
    assert {"kind", "president", "title", "year"} <= set(labels)
    query = "peace and war"
    page.fill("#s-query", query)
    page.select_option("#s-mode", "bm25")
    page.press("#s-query", "Enter")
    page.locator("#s-latency").wait_for()
    request = {"query": query, "mode": "bm25", "top_k": 10, "highlight": True}
    expected = client.post("/search", json=request).json()
    assert expected["results"], "the demo slice should match this query"
    results = page.locator("#s-results > li.result")
    assert results.count() == len(expected["results"])
    assert results.first.get_attribute("data-id") == expected["results"][0]["id"]
    first = expected["results"][0]
    spans = [first["chunk"][a:b] for a, b in first["highlights"]]
    assert spans and results.first.locator("mark").all_inner_texts() == spans  # the server's spans, marked
    assert "and" not in {m.lower() for m in spans}  # stop words never
    assert "score" in results.first.locator(".score").inner_text()
    assert "ms on the server" in page.locator("#s-latency").inner_text()

    president = expected["results"][0]["metadata"]["president"]
    page.select_option("#s-mode", "hybrid")
    page.fill('#s-filter-fields input[data-field="president"]', president)
    page.press("#s-query", "Enter")
    page.locator("#s-status", has_text="(hybrid)").wait_for()
    chips = page.locator(".meta li", has_text="president:").all_inner_texts()
    assert len(chips) == results.count() > 0
    assert set(chips) == {f"president: {president}"}
    counted = client.post("/facets", json={"filter": {"president": president}, "fields": ["year"], "top": 5})
    total, year = counted.json()["total"], counted.json()["fields"]["year"]
    facet = page.locator(
        '#s-facets li.facet[data-field="year"]', has_text=f" of {total}"
    )  # the matches' facets
    facet.wait_for()
    assert facet.locator("button").all_inner_texts() == [
        f"{v['value']} ({v['count']})" for v in year["values"]
    ]
    assert f"{year['numbers']['min']} – {year['numbers']['max']}" in facet.inner_text()
    shoot(page, "search")
    assert errors == []
    page.context.close()


@pytest.mark.parametrize("name", ["fill-mask", "masking", "search"])
def test_pages_are_readable_at_phone_width(browser, server, demo_slice, name):
    page, errors = open_page(browser, server + f"/static/{name}.html", PHONE)
    if name == "fill-mask":
        page.locator(".prediction").first.wait_for()
    elif name == "masking":
        page.locator(".strategy li.tok").first.wait_for()
    else:
        page.fill("#s-query", "the economy and taxes")
        page.press("#s-query", "Enter")
        page.locator("li.result").first.wait_for()
    assert_fits_phone(page)
    shoot(page, f"{name}-phone")
    assert errors == []
    page.context.close()


def test_search_picks_a_collection(browser, server, client, demo_slice):
    """The collection picker lists what GET /collections lists and searches the chosen one's routes."""
    assert client.post("/collections", json={"name": "picked"}).status_code == 201
    documents = [{"id": "picked-1", "text": "Lighthouses guide ships along a rocky coast at night."}]
    assert client.put("/collections/picked/documents", json=documents).status_code == 200
    page, errors = open_page(browser, server + "/static/search.html", WIDE)
    page.locator('#s-collection option[value="picked"]').wait_for(state="attached")
    listed = [entry["name"] for entry in client.get("/collections").json()["collections"]]
    assert page.locator("#s-collection option").all_inner_texts() == listed
    page.select_option("#s-collection", "picked")
    page.fill("#s-query", "a tower with a lamp for sailors")
    page.press("#s-query", "Enter")
    page.locator("#s-latency").wait_for()
    assert page.locator("#s-results > li.result").first.get_attribute("data-id") == "picked-1"
    page.select_option("#s-collection", "default")  # back: the demo slice, never picked-1
    page.locator("#s-latency").wait_for()
    page.wait_for_function("!document.querySelector('#s-results [data-id=\"picked-1\"]')")
    shoot(page, "search-collection")
    assert errors == []
    page.context.close()
    assert client.delete("/collections/picked").status_code == 200


def offline_page(browser, url: str, server: str):
    """A page that can reach the service and nothing else: every other request is refused and recorded."""
    context = browser.new_context(viewport=WIDE)
    elsewhere: list[str] = []

    def only_the_service(route) -> None:
        if route.request.url.startswith(server + "/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", only_the_service)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    return page, errors, elsewhere


def operations(client) -> dict[tuple[str, str], str]:
    """Each operation of the schema, (method, path), and its operationId."""
    paths = client.get("/openapi.json").json()["paths"]
    return {
        (method, path): op["operationId"] for path, methods in paths.items() for method, op in methods.items()
    }


def test_swagger_ui_renders_every_operation_without_internet(browser, server, client):
    """/docs loads Swagger UI's script and style from the service itself (they came from a CDN: blank page)."""
    page, errors, elsewhere = offline_page(browser, server + "/docs", server)
    expected = operations(client)
    page.locator(".opblock").first.wait_for()
    shown = page.locator(".opblock")
    assert shown.count() == len(expected) > 30
    assert page.locator('.opblock-put [data-path="/documents"]').count() == 1
    shoot(page, "docs")
    assert elsewhere == [] and errors == []
    page.context.close()


def test_redoc_renders_every_operation_without_internet(browser, server, client):
    page, errors, elsewhere = offline_page(browser, server + "/redoc", server)
    expected = {f"operation/{operation}" for operation in operations(client).values()}
    page.locator("[data-section-id^='operation/']").first.wait_for()
    sections = (
        "[...document.querySelectorAll('[data-section-id^=\"operation/\"]')].map(e => e.dataset.sectionId)"
    )
    assert set(page.evaluate(sections)) == expected and len(expected) > 30
    shoot(page, "redoc")
    assert elsewhere == [] and errors == []
    page.context.close()


def test_search_falls_back_to_bm25_in_a_collection_of_own_vectors_and_says_so(browser, server, client):
    """Own vectors, no model: the page cannot embed the typed query, so it searches by words and says why;
    back on a collection with a model, the reader's mode returns."""
    created = client.post("/collections", json={"name": "own-playground", "dimension": 3})
    assert created.status_code == 201, created.text
    documents = [
        {"id": "own-1", "text": "lighthouse keepers watch the coast", "vector": [1, 0, 0]},
        {"id": "own-2", "text": "a harbour full of fishing boats", "vector": [0, 1, 0]},
        {"id": "own-3", "text": "the keepers of the lighthouse sleep by day", "vector": [0, 0, 1]},
    ]
    assert client.put("/collections/own-playground/documents", json=documents).status_code == 200
    page, errors = open_page(browser, server + "/static/search.html", WIDE)
    page.locator('#s-collection option[value="own-playground"]').wait_for(state="attached")
    assert page.input_value("#s-mode") == "hybrid"
    page.select_option("#s-collection", "own-playground")
    note = page.locator("#s-mode-note")
    assert note.is_visible() and "searching by words (BM25)" in note.inner_text()
    assert page.input_value("#s-mode") == "bm25"
    assert page.locator("#s-mode option:disabled").all_inner_texts() == ["hybrid", "dense"]
    page.fill("#s-query", "lighthouse keepers")
    page.press("#s-query", "Enter")
    page.locator("#s-status", has_text="(bm25)").wait_for()
    request = {"query": "lighthouse keepers", "mode": "bm25", "top_k": 10}
    expected = client.post("/collections/own-playground/search", json=request).json()["results"]
    shown = page.locator("#s-results > li.result")
    assert [shown.nth(i).get_attribute("data-id") for i in range(shown.count())] == [
        r["id"] for r in expected
    ]
    assert len(expected) == 2
    shoot(page, "search-own-vectors")
    page.select_option("#s-collection", "default")  # a model again: hybrid, every mode offered
    page.locator("#s-status", has_text="(hybrid)").wait_for()
    assert note.is_hidden() and page.locator("#s-mode option:disabled").count() == 0
    assert errors == []
    page.context.close()
    assert client.delete("/collections/own-playground").status_code == 200
