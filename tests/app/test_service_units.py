"""Units of the service below its routes: the API key ring and the text-list validation."""

from __future__ import annotations

import asyncio

import pytest

from app.service import auth
from app.service.auth import KeyRing
from app.service.errors import ApiError
from app.service.validation import check_filter_fields, text_list
from app.settings import Settings
from index.records import UnknownFilterField


def status_of(call) -> int | None:
    try:
        call()
    except ApiError as exc:
        return exc.status
    return None


def test_key_ring_scopes() -> None:
    ring = KeyRing(write_keys=["w1", "w2"], read_keys=["r1"])
    assert ring.scope_of("w2") == "write"
    assert ring.scope_of("r1") == "read"
    assert ring.scope_of("r") is None and ring.scope_of("") is None and ring.scope_of("w1 ") is None
    assert status_of(lambda: ring.check("w1", "write")) is None
    assert status_of(lambda: ring.check("w1", "read")) is None  # write keys also read
    assert status_of(lambda: ring.check("r1", "read")) is None
    assert status_of(lambda: ring.check("r1", "write")) == 403
    assert status_of(lambda: ring.check("nope", "read")) == 401
    assert status_of(lambda: ring.check(None, "write")) == 401


def test_any_key_of_any_kind_guards_reads_and_writes() -> None:
    from app.settings import ScopedKey

    for ring in (
        KeyRing(write_keys=["w"], read_keys=[]),
        KeyRing([], [], [ScopedKey("ka", "write", frozenset({"a"}))]),
    ):
        assert status_of(lambda ring=ring: ring.check(None, "read")) == 401
        assert status_of(lambda ring=ring: ring.check(None, "write")) == 401
    scoped = KeyRing(["admin"], [], [ScopedKey("ka", "write", frozenset({"a"}))])
    assert status_of(lambda: scoped.check("ka", "read", "b")) == 403
    assert status_of(lambda: scoped.check("ka", "read", "a")) is None
    assert status_of(lambda: scoped.check("ka", "write", "a", unscoped=True)) == 403  # deleting a
    assert status_of(lambda: scoped.check("admin", "write", "a", unscoped=True)) is None
    wide_open = KeyRing([], [])
    assert status_of(lambda: wide_open.check(None, "write")) is None
    read_only = KeyRing(write_keys=[], read_keys=["r"])
    assert status_of(lambda: read_only.check(None, "write")) == 401
    assert status_of(lambda: read_only.check("r", "write")) == 403
    assert status_of(lambda: read_only.check(None, "read")) == 401


def test_a_non_ascii_key_matches_as_its_client_sends_it() -> None:
    ring = KeyRing(write_keys=["clé-ünïcode"], read_keys=[])
    on_the_wire = "clé-ünïcode".encode().decode("latin-1")  # how ASGI servers hand a header to the app
    assert ring.scope_of(on_the_wire) == "write"
    assert ring.scope_of(b"cle-unicode".decode("latin-1")) is None


def test_an_empty_batch_budget_variable_leaves_the_choice_to_the_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """.env.example ships ``CLOZE_MAX_BATCH_TOKENS=`` empty: that is the backend's budget, not an error."""
    monkeypatch.setenv("CLOZE_MAX_BATCH_TOKENS", "")
    assert Settings().max_batch_tokens is None
    monkeypatch.setenv("CLOZE_MAX_BATCH_TOKENS", "2048")
    assert Settings().max_batch_tokens == 2048
    monkeypatch.setenv("CLOZE_MAX_BATCH_TOKENS", "10")
    with pytest.raises(ValueError, match="max_batch_tokens"):
        Settings()


def test_every_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    KeyRing(write_keys=["w1", "w2"], read_keys=["r1"]).scope_of("w1")
    assert [b for _, b in compared] == [b"w1", b"w2", b"r1"]  # no early exit on the first match


def test_exposure_needs_keys_off_loopback() -> None:
    auth.check_exposure("127.0.0.1", [], allow_open=False)
    auth.check_exposure("::1", [], allow_open=False)
    auth.check_exposure("0.0.0.0", ["key"], allow_open=False)  # any key: writes are closed
    auth.check_exposure("0.0.0.0", [], allow_open=True)
    with pytest.raises(SystemExit, match="CLOZE_API_KEYS"):
        auth.check_exposure("0.0.0.0", [], allow_open=False)


SETTINGS = Settings(max_inputs=3, max_chars=10)


def field_of(value, name: str = "input") -> str | None:
    try:
        text_list(value, name, SETTINGS)
    except ApiError as exc:
        assert exc.status == 422
        return exc.field
    return None


def test_text_list_accepts_a_string_or_a_bounded_list() -> None:
    assert text_list("one", "input", SETTINGS) == ["one"]
    assert text_list(["a", "b", "c"], "input", SETTINGS) == ["a", "b", "c"]
    assert text_list("x" * 10, "input", SETTINGS) == ["x" * 10]


def test_text_list_names_the_offending_field() -> None:
    assert field_of([]) == "input"
    assert field_of(["a", "b", "c", "d"]) == "input"
    assert field_of(["fine", "   "]) == "input[1]"
    assert field_of(["fine", "x" * 11]) == "input[1]"
    assert field_of("\n\t") == "input"
    assert field_of("x" * 11, "query") == "query"


def test_bounded_pool_answers_429_when_full() -> None:
    import asyncio
    import threading

    from app.service.admission import BoundedPool

    pool = BoundedPool("test", threads=1, max_pending=2)
    release = threading.Event()

    async def scenario() -> list:
        first = asyncio.ensure_future(pool.run(release.wait))
        second = asyncio.ensure_future(pool.run(release.wait))
        await asyncio.sleep(0.05)
        try:
            await pool.run(release.wait)
            refused = None
        except ApiError as exc:
            refused = (exc.status, exc.headers)
        release.set()
        await asyncio.gather(first, second)
        return [refused, pool.pending]

    assert asyncio.run(scenario()) == [(429, {"Retry-After": "1"}), 0]
    pool.shutdown()


def test_job_registry_forgets_old_finished_jobs() -> None:
    from app.service.jobs import JobRegistry

    registry = JobRegistry(keep=3)

    def fail(_progress):
        raise RuntimeError("read-only volume")

    import time

    jobs = []
    for _ in range(10):  # a loop of failing rebuilds (a read-only volume), one after another
        jobs.append(registry.submit("rebuild", fail))
        while jobs[-1].status != "failed":
            time.sleep(0.01)
    registry.shutdown()
    assert len(registry.jobs) == 4  # the newest three finished ones, and the one submitted last
    assert registry.get(jobs[0].job_id) is None and registry.get(jobs[-1].job_id) is not None


def test_writer_waiting_holds_back_new_readers() -> None:
    import threading
    import time

    from index.storage.locks import ReadWriteLock

    lock, order = ReadWriteLock(), []
    first_reader = threading.Event()

    def reader(name: str, hold: float) -> None:
        with lock.read():
            first_reader.set()
            order.append(name)
            time.sleep(hold)

    def writer() -> None:
        with lock.write():
            order.append("writer")

    threads = [threading.Thread(target=reader, args=("r1", 0.3))]
    threads[0].start()
    first_reader.wait()
    threads.append(threading.Thread(target=writer))
    threads[1].start()
    time.sleep(0.05)  # the writer now waits for r1
    threads.append(threading.Thread(target=reader, args=("r2", 0)))
    threads[2].start()
    for thread in threads:
        thread.join(5)
    assert order == ["r1", "writer", "r2"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"a": 1, "a": 2}', 422),
        (b'{"a": NaN}', 422),
        (b'{"a": 1e999}', 422),
        (b'{"a": "\\udc00"}', 422),
        (b"[" * 50 + b"]" * 50, 422),
        (b'{"a": [1, 2, {"b": "ok"}]}', None),
    ],
)
def test_strict_json(body: bytes, status: int | None) -> None:
    from app.service.errors import BodyRejected
    from app.service.validation import strict_loads

    try:
        strict_loads(body)
        got = None
    except BodyRejected as exc:
        got = exc.status_code
    assert got == status


def test_browser_guard() -> None:
    from app.service.middleware import BrowserGuard

    def scope(method: str, **headers: str) -> dict:
        return {
            "type": "http",
            "method": method,
            "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
        }

    keyless = BrowserGuard(None, Settings())
    assert keyless.refusal(scope("GET", host="evil.example"))[0] == 403
    assert keyless.refusal(scope("GET", host="[::1]:8000")) is None
    assert keyless.refusal(scope("POST", host="localhost:8000", origin="http://localhost:8000")) is None
    assert keyless.refusal(scope("POST", host="localhost:8000", origin="null"))[0] == 403
    form = scope("POST", host="127.0.0.1", content_type="application/x-www-form-urlencoded")
    assert keyless.refusal(form)[0] == 415
    open_reads = BrowserGuard(None, Settings(trusted_origins="https://app.example"))
    assert open_reads.refusal(scope("GET", host="evil.example"))[0] == 403  # a rebound page could read
    assert open_reads.refusal(scope("GET", host="10.1.2.3:8000")) is None  # an address cannot be rebound
    assert open_reads.refusal(scope("GET", host="[::1"))[::2] == (403, "Host")  # malformed: no 500
    named = BrowserGuard(None, Settings(allowed_hosts="search.example.org"))
    assert named.refusal(scope("GET", host="search.example.org:8000")) is None
    for keys in ({"api_keys": ["k"]}, {"collection_api_keys": ["k=write:a"]}):  # any key closes reads
        assert BrowserGuard(None, Settings(**keys)).refusal(scope("GET", host="evil.example")) is None
    keyed = BrowserGuard(
        None, Settings(api_keys=["k"], read_api_keys=["r"], trusted_origins="https://app.example")
    )
    assert keyed.refusal(scope("GET", host="search.example.org")) is None  # a page has no key to send
    assert keyed.refusal(scope("POST", host="s.example", origin="https://app.example")) is None
    assert keyed.refusal(scope("POST", host="s.example", sec_fetch_site="cross-site"))[0] == 403


def test_same_origin_through_a_proxy_that_drops_the_port() -> None:
    from app.service.middleware import _same_origin

    assert _same_origin("http://localhost:8000", "localhost:8000")
    assert not _same_origin("http://localhost:9999", "localhost:8000")
    assert _same_origin("http://localhost:8000", "localhost")  # nginx: proxy_set_header Host $host
    assert _same_origin("http://[::1]:8000", "[::1]:8000")
    assert _same_origin("https://search.example", "search.example:443")
    assert not _same_origin("http://evil.example", "localhost")
    assert not _same_origin("http://localhost:99999", "localhost:8000")  # was a 500 (issue 42)
    assert not _same_origin("http://[::1", "[::1]:8000")


def test_read_only_replica_refuses_a_rebuild_at_once(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from app.service.main import create_app

    app = create_app(Settings(index=tmp_path / "idx", index_read_only=True))
    http = TestClient(app, base_url="http://127.0.0.1:8000")  # not as a context: no lifespan, nothing loads
    reply = http.post("/index/rebuild")
    assert reply.status_code == 409 and "read-only" in reply.json()["error"]
    assert http.put("/documents", json=[{"id": "a", "text": "b"}]).status_code == 409
    assert app.state.jobs.jobs == {}


def test_strict_filter_fields_refuse_a_field_no_document_had() -> None:
    """CLOZE_STRICT_FILTER_FIELDS turns MongoDB's absent field (the default: evaluated) into a 422 naming it."""

    class Index:
        def check_filter_fields(self, filters):
            if "colour" in filters:
                raise UnknownFilterField("no document has the metadata field 'colour'", "filter.colour")

    class Pool:
        async def run(self, function, *args):
            return function(*args)

    def status(settings: Settings, filters) -> int | None:
        return status_of(lambda: asyncio.run(check_filter_fields(Index(), filters, settings, Pool())))

    strict = Settings(strict_filter_fields=True)
    assert status(strict, {"colour": "red"}) == 422 and status(strict, {"color": "red"}) is None
    assert status(Settings(), {"colour": "red"}) is None
