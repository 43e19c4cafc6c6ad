"""API keys: ``Authorization: Bearer <key>``. Write keys also read; read keys are optional (unset = reads open).

401 = no or unknown key; 403 = a valid key without the scope. Keys are compared in constant time,
and every configured key is compared, so timing says nothing about which one (or whether one) matched.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Annotated, Literal

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.service.errors import ApiError

Scope = Literal["read", "write"]
bearer = HTTPBearer(auto_error=False, description="An API key from CLOZE_API_KEYS or CLOZE_READ_API_KEYS")


class KeyRing:
    def __init__(self, write_keys: list[str], read_keys: list[str]):
        self.write_keys = [k.encode() for k in write_keys]
        self.read_keys = [k.encode() for k in read_keys]

    def scope_of(self, token: str) -> Scope | None:
        presented = token.encode()
        is_write = _matches_any(presented, self.write_keys)
        is_read = _matches_any(presented, self.read_keys)
        return "write" if is_write else "read" if is_read else None

    def check(self, token: str | None, needed: Scope) -> None:
        guarded = bool(self.write_keys) if needed == "write" else bool(self.read_keys)
        if not guarded:
            return
        if not token:
            raise ApiError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        scope = self.scope_of(token)
        if scope is None:
            raise ApiError(401, "unknown API key", headers={"WWW-Authenticate": "Bearer"})
        if needed == "write" and scope != "write":
            raise ApiError(403, "this API key may read but not write")


def _matches_any(presented: bytes, keys: list[bytes]) -> bool:
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key)
    return matched


def _requirement(needed: Scope, operations: bool = False):
    # async: a plain ``def`` dependency runs on anyio's shared thread pool: a thread hop on every request
    # (docs/benchmarks.md, "Design measurements"), and a keyed search queued there behind upserts.
    async def dependency(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> None:
        if operations and request.app.state.settings.open_operations:
            return
        request.app.state.keys.check(credentials.credentials if credentials else None, needed)

    return dependency


require_read = Depends(_requirement("read"))
require_write = Depends(_requirement("write"))
# /metrics and /readyz: read keys when set (error texts name file paths), unless CLOZE_OPEN_OPERATIONS.
require_operations = Depends(_requirement("read", operations=True))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, write_keys: list[str], allow_open: bool) -> None:
    """Refuse to serve writes to the network without keys unless told the service is meant to be open."""
    if not write_keys and not is_loopback(host) and not allow_open:
        raise SystemExit(
            f"refusing to serve on {host} without API keys: set CLOZE_API_KEYS (and optionally "
            "CLOZE_READ_API_KEYS), or CLOZE_ALLOW_OPEN=true to serve an open service deliberately"
        )
