"""The service's errors as exceptions: every 4xx/5xx answers ``{"error": message, "field": name-or-null}``."""

from __future__ import annotations


class ClozeError(Exception):
    """A request the service refused or could not answer. ``status`` is the HTTP status (0 when the service
    could not be reached), ``field`` the request field it names (``3.vector``, ``filter.year``) or None."""

    def __init__(
        self, message: str, status: int = 0, field: str | None = None, retry_after: float | None = None
    ):
        super().__init__(message)
        self.message, self.status, self.field, self.retry_after = message, status, field, retry_after

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        return f"{self.status or 'no answer'}: {self.message}{where}"


class ConnectionFailed(ClozeError):
    """The service did not answer (refused, reset, timed out)."""


class Unauthorized(ClozeError):
    """401/403: no key, a wrong key, or a key without the scope this request needs."""


class NotFound(ClozeError):
    """404: no such collection, document, snapshot or job."""


class Conflict(ClozeError):
    """409: the name is taken, the index is read-only, a rebuild or snapshot is running."""


class InvalidRequest(ClozeError):
    """422 (and 400, 413): the request breaks a rule the message states; ``field`` names where."""


class Overloaded(ClozeError):
    """429 or 503 after the client's retries: the service is busy or still loading."""


def error_for(status: int, message: str, field: str | None, retry_after: float | None = None) -> ClozeError:
    kind: type[ClozeError] = ClozeError
    if status in (401, 403):
        kind = Unauthorized
    elif status == 404:
        kind = NotFound
    elif status == 409:
        kind = Conflict
    elif status in (400, 413, 422):
        kind = InvalidRequest
    elif status in (429, 503):
        kind = Overloaded
    return kind(message, status, field, retry_after)
