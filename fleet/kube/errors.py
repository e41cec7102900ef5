"""Typed API errors, mapped from HTTP status once, here. Callers catch by type."""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """An API server answered with an error (or could not be reached)."""

    status: int | None = None

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.body = body


class UnreachableError(KubeError):
    """No answer: connection refused, reset, timed out."""


class WatchIdleError(UnreachableError):
    """A watch said nothing, not even a bookmark, for its idle bound: the connection may be
    dead (the peer gone without a word), or the resource merely quiet. Resuming the watch
    from its last resourceVersion tells which (a new request fails if the server is gone)."""


class FencedError(KubeError):
    """A write this process did not send: the Lease it writes under is not known to be
    held any more (its renewal is overdue on this process's own clock, e.g. after the
    process was stopped); another replica may lead already."""


class BadRequestError(KubeError):
    status = 400


class UnauthorizedError(KubeError):
    status = 401


class ForbiddenError(KubeError):
    status = 403


class NotFoundError(KubeError):
    status = 404


class ConflictError(KubeError):
    """409 because of a stale resourceVersion (optimistic concurrency)."""

    status = 409


class AlreadyExistsError(KubeError):
    """409 on create: an object of that name exists."""

    status = 409


class GoneError(KubeError):
    """410: the requested resourceVersion is too old (re-list)."""

    status = 410


class InvalidError(KubeError):
    """422: the object failed validation."""

    status = 422


class TooManyRequestsError(KubeError):
    """429: throttled, or an eviction refused by a PodDisruptionBudget."""

    status = 429

    def __init__(self, message: str, *, status: int | None = None, body: Any = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, status=status, body=body)
        self.retry_after = retry_after


class ServerError(KubeError):
    """5xx."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    422: InvalidError,
    429: TooManyRequestsError,
}


def from_status(status: int, body: str | bytes | dict[str, Any] | None,
                headers: Any = None) -> KubeError:
    """Build the typed error for an HTTP status and a (Status) response body."""
    payload: dict[str, Any] = {}
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            loaded = json.loads(body) if body else {}
            payload = loaded if isinstance(loaded, dict) else {}
        except json.JSONDecodeError:
            payload = {"message": body[:500]}
    elif isinstance(body, dict):
        payload = body
    message = str(payload.get("message") or f"HTTP {status}")
    reason = payload.get("reason")
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExistsError(message, status=status, body=payload)
    if status == 429:
        retry_after = None
        details = payload.get("details") or {}
        if isinstance(details, dict) and details.get("retryAfterSeconds"):
            retry_after = float(details["retryAfterSeconds"])
        elif headers is not None and headers.get("Retry-After"):
            try:
                retry_after = float(headers.get("Retry-After"))
            except ValueError:
                retry_after = None
        return TooManyRequestsError(message, status=status, body=payload, retry_after=retry_after)
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else KubeError
    return cls(message, status=status, body=payload)
