"""Who may call what: one table of routes and scopes (``required_access``), one key ring, one gate.

Write keys (``CLOZE_API_KEYS``) may do everything; read keys (``CLOZE_READ_API_KEYS``) may read. Reads are
open while no read key is set; writes are open only while no key at all is set (a loopback-only service,
``check_exposure``): a service with read keys but no write keys refuses every write. 401 = no or unknown
key; 403 = a valid key without the scope. Keys are compared in constant time, and every configured key is
compared, so timing says nothing about which one (or whether one) matched.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Literal

from fastapi.security import HTTPBearer
from starlette.types import Scope

from app.service.collections import split_collection_route
from app.service.errors import ApiError
from app.service.model_registry import split_model_route
from app.settings import ScopedKey

Access = Literal["public", "operations", "read", "write"]
KeyScope = Literal["read", "write"]
# Documents the scheme in OpenAPI; the gate below decides.
bearer = HTTPBearer(auto_error=False, description="An API key from CLOZE_API_KEYS or CLOZE_READ_API_KEYS")

# The table. GET and HEAD read; a POST reads only when listed here; everything else writes, so a route
# added without a line here needs a write key (tests/app/test_auth_table.py walks every route).
PUBLIC_PATHS = frozenset({"/", "/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
PUBLIC_PREFIXES = ("/static/",)
# /metrics and /readyz: read keys when set (error texts name file paths), unless CLOZE_OPEN_OPERATIONS.
OPERATIONS_PATHS = frozenset({"/metrics", "/readyz"})
READING_POSTS = frozenset(
    {
        "/search",
        "/facets",
        "/embed",
        "/v1/embeddings",
        "/similarity",
        "/tokenize",
        "/decode",
        "/fill-mask",
        "/mask-preview",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
    }
)
READING_METHODS = frozenset({"GET", "HEAD"})


def required_access(method: str, path: str) -> Access:
    _, path = split_model_route(path)  # /models/{name}/embed reads as /embed does
    named, route = split_collection_route(path)
    if named is not None and path.startswith("/collections/"):
        path = route or "/collections/{name}"  # /collections/{name}/search reads as /search does
    if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
        return "public"
    if path in OPERATIONS_PATHS:
        return "operations"
    if method in READING_METHODS or (method == "POST" and path in READING_POSTS):
        return "read"
    return "write"


@dataclass(frozen=True)
class Grant:
    """What a presented key may do: its scope, and the collections it is limited to (None: every one)."""

    scope: KeyScope
    collections: frozenset[str] | None = None

    def may_read(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections


class KeyRing:
    def __init__(self, write_keys: list[str], read_keys: list[str], scoped: list[ScopedKey] | None = None):
        self.write_keys = [k.encode() for k in write_keys]
        self.read_keys = [k.encode() for k in read_keys]
        self.scoped = [(key.key.encode(), Grant(key.access, key.collections)) for key in scoped or []]

    def grant_of(self, token: str) -> Grant | None:
        """The key's grant; every configured key is compared, whichever matches."""
        presented = _header_bytes(token)
        is_write = _matches_any(presented, self.write_keys)
        is_read = _matches_any(presented, self.read_keys)
        scoped = None
        for key, grant in self.scoped:
            if hmac.compare_digest(presented, key):
                scoped = grant
        if is_write or is_read:
            return Grant("write" if is_write else "read")
        return scoped

    def scope_of(self, token: str) -> KeyScope | None:
        grant = self.grant_of(token)
        return grant.scope if grant is not None else None

    def guarded(self, needed: KeyScope) -> bool:
        scoped_reads = any(grant.scope == "read" for _, grant in self.scoped)
        if needed == "read":
            return bool(self.read_keys) or scoped_reads
        return bool(self.write_keys or self.read_keys or self.scoped)

    def check(
        self, token: str | None, needed: KeyScope, collection: str | None = None, path: str = ""
    ) -> Grant | None:
        """The caller's grant when the key may do ``needed`` (on ``collection``, for a collection's route);
        None when the route is open. 401 for a missing or unknown key, 403 for one without the right."""
        if not self.guarded(needed):
            return None
        if not token:
            raise ApiError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        grant = self.grant_of(token)
        if grant is None:
            raise ApiError(401, "unknown API key", headers={"WWW-Authenticate": "Bearer"})
        if needed == "write" and grant.scope != "write":
            if not self.write_keys and not self.scoped:
                raise ApiError(403, "writes are disabled: this service has read keys but no write keys")
            raise ApiError(403, "this API key may read but not write")
        if grant.collections is not None:
            check_scoped(grant, needed, collection, path)
        return grant


def check_scoped(grant: Grant, needed: KeyScope, collection: str | None, path: str) -> None:
    """A key scoped to collections reaches those collections, the collection listing (which shows only
    them) and the model routes; anything else (creating a collection, /metrics) needs an unscoped key."""
    names = ", ".join(sorted(grant.collections or ()))
    if collection is not None:
        if not grant.may_read(collection):
            raise ApiError(403, f"this API key is scoped to the collections {names}, not {collection!r}")
    elif needed == "write" or path in OPERATIONS_PATHS:
        raise ApiError(403, f"this API key is scoped to the collections {names}: this needs an unscoped key")


def _header_bytes(token: str) -> bytes:
    """The key as the client sent it: ASGI servers decode header bytes as latin-1, so encoding back gives
    the bytes on the wire (a UTF-8 key stays UTF-8 and matches ``key.encode()``)."""
    try:
        return token.encode("latin-1")
    except UnicodeEncodeError:  # a caller that passed text, not a header value
        return token.encode()


def _matches_any(presented: bytes, keys: list[bytes]) -> bool:
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key)
    return matched


def bearer_token(scope: Scope) -> str | None:
    """The token of ``Authorization: Bearer <token>``, as FastAPI's ``HTTPBearer(auto_error=False)`` reads it."""
    for key, value in scope["headers"]:
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return (token.strip() or None) if scheme.lower() == "bearer" else None
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, keys: list[str], allow_open: bool) -> None:
    """Refuse to serve writes to the network without keys unless told the service is meant to be open."""
    if not keys and not is_loopback(host) and not allow_open:
        raise SystemExit(
            f"refusing to serve on {host} without API keys: set CLOZE_API_KEYS (and optionally "
            "CLOZE_READ_API_KEYS), or CLOZE_ALLOW_OPEN=true to serve an open service deliberately"
        )
