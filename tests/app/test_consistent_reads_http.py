"""Issue 67, part 1, through the HTTP app in-process: while PUTs flip documents between two metadata shapes, every
filtered search (each mode) returns only documents whose returned metadata matches the filter, and a listing's
``total`` counts the page it came with. The index-level property test drives more rounds and two writers."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.service.engines import close_engines
from app.service.main import create_app
from app.settings import Settings
from tests.index.test_consistent_reads import FILTERS, GROUPS, MODES, TIER_FILTERS, TIERS
from tests.index.test_filter_oracle import holds

DOCS, READS = 16, 160


@pytest.fixture()
def http(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(index=tmp_path / "idx", collections_dir=tmp_path / "collections"))
    client = TestClient(app, base_url="http://127.0.0.1")  # not as a context: no lifespan, no model loads
    assert client.post("/collections", json={"name": "flips", "dimension": 3}).status_code == 201
    yield client
    asyncio.run(close_engines(app.state.engines, app.state.lifecycle))


def document(i: int, shape: dict) -> dict:
    return {
        "id": f"d{i}",
        "text": f"lighthouse keeper {i}",
        "metadata": shape,
        "vector": [1.0, i / DOCS, 0.5],
    }


def read(http: TestClient, mode: str, node: dict) -> str | None:
    """What is wrong with one answer (None: it holds in the state it read)."""
    if mode == "facets":  # every document holds one grp and one flag: each field's counts sum to the total
        answer = http.post("/collections/flips/facets", json={"filter": node, "fields": ["grp", "flag"]})
        assert answer.status_code == 200, answer.text
        found = answer.json()
        counts = {
            name: {v["value"]: v["count"] for v in found["fields"][name]["values"]}
            for name in ("grp", "flag")
        }
        sums = {name: sum(c.values()) for name, c in counts.items()}
        return None if set(sums.values()) == {found["total"]} else f"facets {node}: {found['total']}, {sums}"
    if mode == "list":
        answer = http.get(
            "/collections/flips/documents", params={"limit": DOCS, "filter": json.dumps(node)}
        ).json()
        returned, total = answer["documents"], answer["total"]
        if total != len(returned):
            return f"list {node}: total {total}, page of {len(returned)}"
    else:
        body = {"query": "lighthouse", "vector": [1, 0, 0], "mode": mode, "filter": node, "top_k": DOCS}
        if mode == "bm25":
            del body["vector"]
        answer = http.post("/collections/flips/search", json=body)
        assert answer.status_code == 200, answer.text
        returned = answer.json()["results"]
    wrong = [(d["id"], d["metadata"]) for d in returned if not holds(d["metadata"], node)]
    return f"{mode} {node}: returned {wrong[0]}" if wrong else None


def test_http_answers_hold_in_the_state_they_read(http: TestClient) -> None:
    first = [document(i, {"grp": "a", **TIERS[0]}) for i in range(DOCS)]
    assert http.put("/collections/flips/documents", json=first).status_code == 200
    stop, rng, bad, answers, writes = threading.Event(), random.Random(7), [], Counter(), Counter()

    def writer() -> None:
        flips = random.Random(8)
        while not stop.is_set():
            shape = {"grp": flips.choice(GROUPS), **flips.choice(TIERS)}
            batch = [document(i, shape) for i in flips.sample(range(DOCS), 3)]
            writes[http.put("/collections/flips/documents", json=batch).status_code] += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(READS):
            mode = rng.choice(MODES)
            answers[mode] += 1
            if problem := read(http, mode, rng.choice(FILTERS + TIER_FILTERS)):
                bad.append(problem)
    finally:
        stop.set()
        thread.join(30)
    print(f"{dict(answers)} answers, {len(bad)} bad, writes {dict(writes)}")
    assert set(writes) == {200} and writes[200] > 5, writes
    assert not bad, f"{len(bad)} of {READS} answers contradict their filter: {bad[:5]}"
