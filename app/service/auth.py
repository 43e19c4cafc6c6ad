"""Who may call what: one key ring and its check. What each route needs is declared on the route itself
(``route_table.declare``); the access gate (``middleware.AccessGate``) reads that declaration and asks here.

Write keys (``CLOZE_API_KEYS``) may do everything; read keys (``CLOZE_READ_API_KEYS``) may read; keys scoped
to collections (``CLOZE_COLLECTION_API_KEYS``) reach only what theirs hold, and never create or delete one.
One rule: once any key of any kind is set, every route but the public ones and /readyz needs a key (reads
included); with no key at all everything is open (a loopback-only service, ``check_exposure``). A service with read keys but no write keys refuses every write.
401 = no or unknown key; 403 = a valid key without the scope. Keys are compared in constant time, and every
configured key is compared, so timing says nothing about which one (or whether one) matched.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Literal

from fastapi.security import HTTPBearer
from starlette.types import Scope

from app.service.errors import ApiError
from app.settings import ScopedKey

KeyScope = Literal["read", "write"]
# Documents the scheme in OpenAPI; the access gate decides.
bearer = HTTPBearer(auto_error=False, description="An API key from CLOZE_API_KEYS or CLOZE_READ_API_KEYS")


@dataclass(frozen=True)
class Grant:
    """What a presented key may do: its scope, and the collections it is limited to (None: every one)."""

    scope: KeyScope
    collections: frozenset[str] | None = None

    def may_read(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections


# A caller without a valid key on an open route that shows more to keys (``probe``): it reads no collection.
NO_COLLECTIONS = Grant("read", frozenset())


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

    def caller(self, token: str | None) -> Grant | None:
        """What a route open to everyone may show its caller: None (everything) where no key is set, else the
        key's grant; a missing or unknown key is no error there, it reads no collection."""
        if not self.keyed:
            return None
        return (self.grant_of(token) if token else None) or NO_COLLECTIONS

    @property
    def keyed(self) -> bool:
        """Whether any key is configured: then every route that is not public needs one."""
        return bool(self.write_keys or self.read_keys or self.scoped)

    def check(
        self, token: str | None, needed: KeyScope, collection: str | None = None, unscoped: bool = False
    ) -> Grant | None:
        """The caller's grant when the key may do ``needed`` (on ``collection``, for a collection's route;
        ``unscoped``: only a key not scoped to collections may, as for /metrics or deleting a collection);
        None when the route is open. 401 for a missing or unknown key, 403 for one without the right."""
        if not self.keyed:
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
            check_scoped(grant, needed, collection, unscoped)
        return grant


def check_scoped(grant: Grant, needed: KeyScope, collection: str | None, unscoped: bool) -> None:
    """A key scoped to collections reaches what those collections hold (documents, search, rebuilds,
    snapshots, restores), the collection listing (which shows only them) and the model routes. Whether a
    collection exists is the operator's: creating or deleting one, like /metrics, needs an unscoped key."""
    names = ", ".join(sorted(grant.collections or ()))
    if unscoped or (collection is None and needed == "write"):
        raise ApiError(403, f"this API key is scoped to the collections {names}: this needs an unscoped key")
    if collection is not None and not grant.may_read(collection):
        raise ApiError(403, f"this API key is scoped to the collections {names}, not {collection!r}")


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
