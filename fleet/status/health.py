"""What /healthz and /readyz answer: named checks, each saying what is wrong (or None).

Liveness ("restart me"): the control loop is wedged - a planning pass running, or a
change waiting for one, for longer than a bound; or a watch task that neither makes
progress nor fails. An API server that keeps refusing is *not* a liveness failure (the
watches are turning, failing and retrying; a restart would not help).

Readiness ("send me traffic", "count me as rolled out"): the caches this replica runs
are synced, and, when the runtime extension is served, its certificate is loaded. A
standby replica (not the Lease holder) runs no controller caches and is ready once its
own parts are.
"""

from __future__ import annotations

from collections.abc import Callable

Check = Callable[[], str | None]


class Probe:
    """An ordered set of named checks."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        self._checks[name] = check

    def problems(self) -> list[str]:
        out: list[str] = []
        for name, check in list(self._checks.items()):
            try:
                problem = check()
            except Exception as e:  # a broken check is a failing check, never a 200
                problem = f"check failed: {e!r}"
            if problem:
                out.append(f"{name}: {problem}")
        return out


class Health:
    def __init__(self) -> None:
        self.live = Probe()
        self.ready = Probe()


__all__ = ["Check", "Health", "Probe"]
