"""Units of the service below its routes: the API key ring and the text-list validation."""

from __future__ import annotations

import pytest

from app.service import auth
from app.service.auth import KeyRing
from app.service.errors import ApiError
from app.service.validation import text_list
from app.settings import Settings


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


def test_unset_key_lists_leave_that_scope_open() -> None:
    open_reads = KeyRing(write_keys=["w"], read_keys=[])
    assert status_of(lambda: open_reads.check(None, "read")) is None
    assert status_of(lambda: open_reads.check(None, "write")) == 401
    wide_open = KeyRing([], [])
    assert status_of(lambda: wide_open.check(None, "write")) is None


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
    auth.check_exposure("0.0.0.0", ["key"], allow_open=False)
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
