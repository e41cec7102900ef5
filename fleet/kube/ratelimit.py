"""A client-side bound on a client's write rate: a token bucket, as client-go's.

A controller replica's start-up writes (status patches, version adoptions, NodePlan
creates, Events: ~6 per cluster of a fresh fleet, ~600 per replica when ten share 1000
clusters) all go to the one management API server. Unbounded, ten replicas starting
together sent ~6000 writes in a few seconds on a 2-core machine and the server then
answered the replicas' own Lease renewals in 4-5 s (bench/README.md, r10x100c).
:class:`WriteLimiter` spreads a replica's writes: at most ``burst`` at once, then
``qps`` per second, like client-go's ``QPS`` / ``Burst``
(``flowcontrol.NewTokenBucketRateLimiter``): the bucket holds ``burst`` tokens and
starts full, one token comes back every ``1/qps`` seconds, every write takes one, a
write finding none waits for its turn (reservations queue: the n-th waiter goes
``n/qps`` after the bucket ran dry, never all at once when a token comes back).

Only writes are limited (:meth:`fleet.kube.KubeClient.limited`): reads and watches feed
the caches and are not what loads the server's storage. The Lease renewals are never
limited: they run on clients of their own (:meth:`fleet.kube.KubeClient.reopen`, which
builds a client without a limiter). The server side of the same problem is the chart's
API Priority and Fairness FlowSchema (docs/operations.md "API priority of the Leases").

Bound (what the tests check): for any interval of length ``t``, the writes *released*
in it are at most ``burst + qps * t``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

log = logging.getLogger(__name__)

# A write waiting longer than this for its turn is logged (at most every LOG_EVERY s).
LOG_WAIT_SECONDS = 1.0
LOG_EVERY = 30.0


@dataclass
class LimiterStats:
    """What the limiter did: writes released, how many of them waited, for how long in
    total (seconds, as reserved), and the longest single wait."""

    taken: int = 0
    delayed: int = 0
    waited_seconds: float = 0.0
    longest_wait: float = 0.0
    returned: int = 0  # reservations given back by a cancelled waiter


class TokenBucket:
    """The bucket itself, pure: no sleeping, time from ``clock`` (monotonic seconds).

    :meth:`reserve` takes a token and says how long the caller must wait before it may
    act; the token count may go negative (reservations for the waiters, as
    ``golang.org/x/time/rate``'s ``Reserve``, which client-go's limiter uses).
    """

    def __init__(self, qps: float, burst: int, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not qps > 0 or not math.isfinite(qps):
            raise ValueError(f"qps must be a positive number, got {qps!r}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        self.qps = float(qps)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(self.burst)  # starts full
        self._at = clock()
        self._lock = threading.Lock()  # reserve() is cheap; callable from any thread
        self.stats = LimiterStats()

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now

    def reserve(self) -> float:
        """Take one token; the seconds to wait before acting on it (0.0: act now)."""
        with self._lock:
            now = self._clock()
            self._refill(now)
            self._tokens -= 1.0
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
            s = self.stats
            s.taken += 1
            if wait > 0:
                s.delayed += 1
                s.waited_seconds += wait
                s.longest_wait = max(s.longest_wait, wait)
            return wait

    def give_back(self) -> None:
        """Return a reserved token whose write was not sent (its waiter was cancelled)."""
        with self._lock:
            self._refill(self._clock())
            self._tokens = min(float(self.burst), self._tokens + 1.0)
            self.stats.returned += 1

    def tokens(self) -> float:
        """Tokens now (negative: reserved ahead by waiters)."""
        with self._lock:
            self._refill(self._clock())
            return self._tokens


class WriteLimiter:
    """A :class:`TokenBucket` for one client's writes: :meth:`wait` before each one."""

    def __init__(self, qps: float, burst: int, *, name: str = "writes",
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep) -> None:
        self.bucket = TokenBucket(qps, burst, clock=clock)
        self.name = name
        self._clock = clock
        self._sleep = sleep
        self._logged_at = -math.inf

    @property
    def qps(self) -> float:
        return self.bucket.qps

    @property
    def burst(self) -> int:
        return self.bucket.burst

    @property
    def stats(self) -> LimiterStats:
        return self.bucket.stats

    async def wait(self) -> None:
        """Return when this write may be sent. Cancelled while waiting, the token goes
        back (the write was not sent)."""
        delay = self.bucket.reserve()
        if delay <= 0:
            return
        if delay > LOG_WAIT_SECONDS and self._clock() - self._logged_at > LOG_EVERY:
            self._logged_at = self._clock()
            s = self.stats
            log.info("%s: a write waits %.1fs for its turn (limit %g/s, burst %d; %d of "
                     "%d writes waited so far)", self.name, delay, self.qps, self.burst,
                     s.delayed, s.taken)
        try:
            await self._sleep(delay)
        except BaseException:
            self.bucket.give_back()
            raise


__all__ = ["LimiterStats", "TokenBucket", "WriteLimiter"]
