"""Typed API errors, mapped from HTTP status once, here. Callers catch by type."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class KubeError(Exception):
    """An API server answered with an error (or could not be reached). ``retry_after``:
    the seconds the server asked the client to wait before trying again (a 429 or a 5xx
    with ``details.retryAfterSeconds`` or a ``Retry-After`` header), else None."""

    status: int | None = None

    def __init__(self, message: str, *, status: int | None = None, body: Any = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.body = body
        self.retry_after = retry_after


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


def answer(who: str, status: int, data: bytes, headers: Any,
           decode: Callable[[bytes], Any]) -> Any:
    """A response's body as ``decode`` reads it (None when empty), or the typed error for
    a non-2xx status or a body that does not decode (``who``: server, method and path)."""
    if not 200 <= status <= 299:
        raise from_status(status, data, headers)
    if not data:
        return None
    try:
        return decode(data)
    except ValueError as e:
        raise KubeError(f"{who}: undecodable answer: {e}") from None


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
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else KubeError
    retry_after = _retry_after(payload, headers) if status == 429 or status >= 500 else None
    return cls(message, status=status, body=payload, retry_after=retry_after)


def _retry_after(payload: dict[str, Any], headers: Any) -> float | None:
    """The wait the server asked for: the Status' ``details.retryAfterSeconds``, else a
    ``Retry-After`` header in seconds (None when neither is there or usable)."""
    details = payload.get("details") or {}
    if isinstance(details, dict) and details.get("retryAfterSeconds"):
        try:
            return max(0.0, float(details["retryAfterSeconds"]))
        except (TypeError, ValueError):
            pass
    value = headers.get("Retry-After") if headers is not None else None
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            return None
    return None


# A GET the server answered "try again after N s" (429: API Priority and Fairness
# rejected it before it ran; 5xx ServerTimeout, e.g. a list page under load) is sent
# again, as client-go does (at most 10 times), after that wait stretched by a random
# factor of 1-2, so that the requests rejected together do not all come back together;
# a paged list then resumes at its page instead of starting over (a list of 20 pages
# under load otherwise rarely completes). No single wait is longer than RETRY_AFTER_CAP.
GET_RETRIES = 10
RETRY_AFTER_CAP = 10.0


def retry_wait(method: str, error: KubeError, retries_so_far: int, jitter: float
               ) -> float | None:
    """How long to wait before sending ``method`` again after ``error`` (None: do not);
    ``jitter`` in [0, 1) stretches the server's wait by that fraction."""
    if method != "GET" or error.retry_after is None or retries_so_far >= GET_RETRIES:
        return None
    return min(error.retry_after * (1.0 + jitter), RETRY_AFTER_CAP)
