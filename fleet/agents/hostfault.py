"""Host faults (the node's own filesystem failing the agent) end a request in a failure
state, never in a retry loop.

A read-only binary directory, a full disk at fsync/rename/marker write, a vanished
staging directory: each surfaces as an ``OSError`` from some filesystem call. Errors
that cannot fix themselves (read-only filesystem, permission) fail the request at once;
those that might (a full disk freed by log rotation, an I/O hiccup) get a few attempts.
The failure state depends on where the request was, and its reason names the path and
the errno, so an operator sees ``FailedApply: /usr/local/bin/.k0s.fleet-new: EROFS
(Read-only file system)`` instead of a node stuck in ``ApplyingUpdate``. Pure.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from fleet.contract.signal import SignalState

# Nothing the agent can wait out.
PERSISTENT = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
ATTEMPTS = 3  # for the others (ENOSPC, EDQUOT, EIO, ENOENT, ...)


def describe(e: OSError) -> str:
    """``<path>: <ERRNO> (<text>)``, e.g. ``/usr/local/bin/k0s: ENOSPC (No space left on
    device)``; with two paths (rename, link) both are named."""
    code = errno.errorcode.get(e.errno, f"errno {e.errno}") if e.errno else type(e).__name__
    text = e.strerror or str(e)
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    where = " -> ".join(paths) if paths else "(no path reported)"
    return f"{where}: {code} ({text})"


def failure_state(state: SignalState | None) -> SignalState:
    """The failure a host fault in ``state`` ends in."""
    if state in (None, SignalState.DOWNLOADING):
        return SignalState.FAILED_DOWNLOAD
    if state in (SignalState.VERIFYING, SignalState.UNCORDONING):
        return SignalState.FAILED_VERIFY
    return SignalState.FAILED_APPLY  # Cordoning, ApplyingUpdate, Restarting


@dataclass
class HostFaults:
    """Consecutive host faults per step of one request."""

    attempts: int = ATTEMPTS
    _seen: dict[SignalState | None, int] = field(default_factory=dict)

    def give_up(self, state: SignalState | None, e: OSError) -> bool:
        """Record a fault in ``state``; True when the request must fail now."""
        n = self._seen[state] = self._seen.get(state, 0) + 1
        return e.errno in PERSISTENT or n >= self.attempts

    def reset(self) -> None:
        self._seen.clear()


__all__ = ["ATTEMPTS", "PERSISTENT", "HostFaults", "describe", "failure_state"]
