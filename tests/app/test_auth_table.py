"""Every route of the app declares its access (and, for a collection's route, the path parameter naming the
collection) where it is declared; the gate, the metric labels and the collection dependency read that one
declaration (``app.service.route_table``). This walks every route the router matches."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.service.main import create_app
from app.settings import Settings

PUBLIC = {
    "/",
    "/healthz",
    "/docs",
    "/docs/oauth2-redirect",
    "/docs/assets/{path}",
    "/redoc",
    "/openapi.json",
    "/static/{path}",
}
PROBES = {"/readyz"}  # open; what they show depends on the caller's key
OPERATIONS = {"/metrics"}
# Everything else reads, but these (with or without /collections/{collection} in front).
WRITES = {
    ("PUT", "/documents"),
    ("DELETE", "/documents/{doc_id}"),
    ("POST", "/index/rebuild"),
    ("POST", "/collections/{collection}/snapshots"),
    ("DELETE", "/collections/{collection}/snapshots/{snapshot}"),
    ("POST", "/collections/{collection}/snapshots/{snapshot}/restore"),
    ("POST", "/collections/{collection}/restore"),
}
ADMIN = {("POST", "/collections"), ("DELETE", "/collections/{name}")}  # whether a collection exists
COLLECTION_ROUTES = ("/search", "/facets", "/documents", "/index/", "/jobs/", "/collections/{collection}")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):
    return create_app(Settings(index=Path(tmp_path_factory.mktemp("auth-table")) / "idx"))


def test_every_route_declares_its_access_and_collection(app) -> None:
    table = app.state.routes
    assert not table.undeclared()
    seen = set()
    for entry in table.entries:
        for method in sorted(entry.methods or {"GET"}):
            path = entry.template.replace("{collection}", "c").replace("{name}", "c")
            for value in ("{doc_id}", "{job_id}", "{snapshot}", "{model}", "{path}"):
                path = path.replace(value, "x")
            declared = table.resolve_path(method, path)
            assert declared.template == entry.template, (method, path)  # the first match is the route itself
            plain = entry.template.removeprefix("/collections/{collection}") or entry.template
            if entry.template in PUBLIC:
                expected = "public"
            elif entry.template in PROBES:
                expected = "probe"
            elif entry.template in OPERATIONS:
                expected = "operations"
            elif (method, entry.template) in ADMIN:
                expected = "admin"
            elif (method, entry.template) in WRITES or (method, plain) in WRITES:
                expected = "write"
            else:
                expected = "read"
            assert declared.access == expected, (method, entry.template)
            about_a_collection = (
                entry.template.startswith(COLLECTION_ROUTES) or entry.template == "/collections/{name}"
            )
            assert (declared.collection is not None) == about_a_collection, entry.template
            if declared.collection is not None:
                assert declared.collection == ("c" if "/collections/" in entry.template else "default")
            seen.add((method, entry.template))
    documented = {(m.upper(), p) for p, ops in app.openapi()["paths"].items() for m in ops}
    assert documented <= seen and len(documented) > 40  # every documented route is matched and declared
    assert all(ops[m]["x-access"] for ops in app.openapi()["paths"].values() for m in ops)  # shown in OpenAPI


def test_named_model_and_rerank_routes_read_and_unknown_routes_need_a_write_key(app) -> None:
    table = app.state.routes
    for route in ("embed", "similarity", "tokenize", "decode", "fill-mask", "rerank"):
        assert table.resolve_path("POST", f"/models/legal/{route}").access == "read", route
    for path in ("/rerank", "/v1/rerank", "/v2/rerank", "/embed", "/v1/embeddings"):
        assert table.resolve_path("POST", path).access == "read", path
    unknown = table.resolve_path("POST", "/models/legal/documents")
    assert (unknown.access, unknown.template) == ("write", "unmatched")
    assert table.resolve_path("GET", "/no/such/route").template == "unmatched"
    lane = table.resolve_path("POST", "/models/legal/embed")
    assert lane.template == "/models/{model}/embed"  # a template, whatever the name: bounded metric labels


def test_only_the_snapshot_upload_declares_a_streamed_body(app) -> None:
    """``BodySizeLimit`` passes a body on unread only where its route said it streams it under a bound of
    its own: the upload, and no route that reads its body whole (the same path with another method, or a
    stored snapshot's restore, included)."""
    table = app.state.routes
    streamed = {
        (method, entry.template)
        for entry in table.entries
        for method in entry.methods or ()
        if (entry.declaration or {}).get("x-streamed-body")
    }
    assert streamed == {("POST", "/collections/{collection}/restore")}
    assert table.resolve_path("POST", "/collections/legal/restore").streamed_body
    assert not table.resolve_path("POST", "/collections/legal/snapshots/x/restore").streamed_body
    assert not table.resolve_path("POST", "/restore").streamed_body  # no such route: read whole, bounded
    assert not table.resolve_path("PUT", "/documents").streamed_body


def test_the_route_cache_holds_no_long_or_unmatched_paths(app) -> None:
    """The cache of resolved routes is filled before the key check: 4,096 distinct 60 KB paths answered 401
    pinned about 250 MB in it. Paths no route matches, and long ones, are resolved each time instead."""
    import tracemalloc

    table = app.state.routes
    long_id = "x" * 60_000
    table.resolve_path("GET", "/healthz")  # any first-use allocations outside the measurement
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(500):
            assert table.resolve_path("GET", f"/{i}{long_id}").template == "unmatched"
            # a long path that matches a route (a document id) is no cheaper to keep
            assert table.resolve_path("GET", f"/documents/{i}{long_id}").template == "/documents/{doc_id}"
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 << 20, f"{held / 2**20:.0f} MiB held after 1,000 long paths"
    first = table.resolve_path("POST", "/collections/notes/search")
    assert table.resolve_path("POST", "/collections/notes/search") is first  # a short matched path is cached
