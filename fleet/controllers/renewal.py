"""Lease renewals on a thread of their own, so a busy event loop cannot starve them.

A controller replica renews its Leases (the one-leader Lease, or sharded: its member
Lease and the fleet-wide writer Lease) from :class:`RenewalThread`: a thread with its own
event loop and its own client (the same API server, credentials and TLS, connections of
its own: :meth:`fleet.kube.KubeClient.reopen`). Whatever the main event loop does (decode
a large list, run a planning pass on a starved CPU) the renewal runs on time; the main
loop reads what it needs (the monotonic start of the last good renewal, whether the Lease
is held) from plain attributes the thread sets (single assignments: atomic for Python's
threads). The write fences keep their meaning: a write needs the last good renewal to have
*started* less than the renew deadline ago on the process's monotonic clock. A SIGSTOP
stops every thread of the process, the renewal thread too, so the fence's argument (the
holder stops writing before anyone may take over) is the same as with one event loop.

Two limits remain. A C call that holds the interpreter lock (``json.loads`` of a large
list) delays the thread for as long as it runs (seconds at most, not the whole stretch of
Python code around it, which is preempted every few milliseconds). And a renewal thread
alone could keep a wedged replica's Leases forever: so it renews only while the main loop
shows a :class:`Heartbeat` within a bound (``stall_seconds``, by default four leases:
60 s with 15 s Leases, two orders of magnitude longer than a planning pass over 1000
clusters and longer than the first one at start-up). Past it the thread stops renewing and
calls ``on_stall`` (the controller process exits once its write fence has closed, unless
its main loop comes back first and stops in order; /healthz says why meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from fleet.kube import KubeClient

log = logging.getLogger(__name__)

STALL_LEASES = 4  # default liveness bound of the main loop, in lease durations


def stall_bound(lease_seconds: float, stall_seconds: float | None, renew_deadline: float,
                *, what: str) -> float:
    """The main loop's liveness bound (default :data:`STALL_LEASES` leases); one not
    longer than the renew deadline is refused, naming ``what`` needs it."""
    bound = stall_seconds or STALL_LEASES * lease_seconds
    if not bound > renew_deadline:
        raise ValueError(f"{what} needs stall_seconds ({bound}) > renew_deadline "
                         f"({renew_deadline}): a main loop may be busy longer than that")
    return bound


def renewal_wait(*, failed: bool, last_ok: float, now: float, renew_every: float,
                 renew_deadline: float) -> float:
    """Seconds to wait before the next renewal of a held Lease: renew_every after the
    start of the last good renewal (at once if it took that long to answer: a slow server
    eats into the deadline), renew_every / 5 after a failure; never past the deadline."""
    delay = renew_every / 5 if failed else renew_every - (now - last_ok)
    left = last_ok + renew_deadline - now
    return max(0.0, min(delay, left))


@dataclass(frozen=True)
class RenewalEnd:
    """Why a held Lease is no longer renewed: ``stalled`` when the main loop showed no
    sign of life within its bound, else a renewal overdue (the renew deadline passed)."""

    problem: str
    stalled: bool


async def renew_while_held(*, lease: str, identity: str,
                           attempt: Callable[[float], Awaitable[bool]],
                           renewed: Callable[[float], None], last_ok: float,
                           heartbeat: Heartbeat, renew_every: float, renew_deadline: float,
                           monotonic: Callable[[], float] = time.monotonic) -> RenewalEnd:
    """Renew a held Lease until it may no longer be: ``attempt(timeout)`` is one renewal
    cut off after ``timeout`` seconds (True: it landed), ``renewed(started)`` records the
    monotonic start of each good one (``last_ok``: the first). Stops, naming ``lease`` in
    the problem, once the main loop stalled past the heartbeat's bound or no renewal has
    landed within ``renew_deadline`` of the last good one's start (before another
    candidate may take the Lease over)."""
    failed = False
    while True:
        await anyio.sleep(renewal_wait(failed=failed, last_ok=last_ok, now=monotonic(),
                                       renew_every=renew_every,
                                       renew_deadline=renew_deadline))
        stalled = heartbeat.stalled()
        if stalled is not None:
            problem = f"{lease} no longer renewed: {stalled}"
            log.error("%s: %s", identity, problem)
            return RenewalEnd(problem, stalled=True)
        started = monotonic()
        left = last_ok + renew_deadline - started
        failed = not (left > 0 and await attempt(left))
        if not failed:
            last_ok = started
            renewed(started)
        elif monotonic() - last_ok >= renew_deadline:
            problem = f"{lease} not renewed within {renew_deadline:.1f}s"
            log.warning("%s: %s; stopping", identity, problem)
            return RenewalEnd(problem, stalled=False)


class Heartbeat:
    """The main event loop's sign of life: :meth:`run`, a task on that loop, stamps the
    monotonic time every ``every`` seconds; the renewal thread reads the stamp."""

    def __init__(self, bound: float, *, monotonic: Callable[[], float] = time.monotonic
                 ) -> None:
        self.bound = bound
        self.every = min(1.0, bound / 10)
        self.monotonic = monotonic
        self._at = monotonic()

    def beat(self) -> None:
        self._at = self.monotonic()

    def stalled(self) -> str | None:
        """Why renewals must stop (None: the main loop beat within the bound)."""
        silent = self.monotonic() - self._at
        if silent <= self.bound:
            return None
        return (f"the main event loop showed no sign of life for {silent:.1f}s "
                f"(bound {self.bound:.1f}s)")

    async def run(self) -> None:
        while True:
            self.beat()
            await anyio.sleep(self.every)


class Wake:
    """Wakes a task of the event loop it was made on, from any thread."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody to wake
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout: float) -> bool:
        """Until woken (since the last wait) or ``timeout`` seconds passed: whether woken."""
        with anyio.move_on_after(max(0.0, timeout)):
            await self._event.wait()
        woken = self._event.is_set()
        self._event.clear()
        return woken


class RenewalThread:
    """Runs one job (a Lease's renewal loop) on a thread with its own event loop, given a
    client of its own reopened from ``client``; :meth:`stop` cancels it from any thread."""

    def __init__(self, name: str, client: KubeClient) -> None:
        self.name = name
        self._origin = client
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scope: anyio.CancelScope | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, job: Callable[[KubeClient], Awaitable[None]],
              on_end: Callable[[], None]) -> None:
        async def body() -> None:
            with anyio.CancelScope() as scope:
                with self._lock:
                    if self._stopping:
                        return
                    self._loop, self._scope = asyncio.get_running_loop(), scope
                client = await self._origin.reopen(name=f"{self._origin.name}-{self.name}")
                try:
                    await job(client)
                finally:
                    with anyio.CancelScope(shield=True):
                        await client.close()

        def main() -> None:
            try:
                anyio.run(body)
            except BaseException as e:  # reported to the main loop
                self.error = e
                log.error("%s renewal thread failed: %r", self.name, e)
            finally:
                on_end()

        self._thread = threading.Thread(target=main, name=f"k0s-fleet-{self.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Cancel the job (from any thread); it returns at its next await."""
        with self._lock:
            self._stopping = True
            loop, scope = self._loop, self._scope
        if loop is not None and scope is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                loop.call_soon_threadsafe(scope.cancel)

    async def stop_and_join(self, timeout: float) -> None:
        """:meth:`stop`, then wait (at most ``timeout`` seconds, shielded) for the thread
        to end, so that no renewal is sent after this returns (unless it timed out)."""
        self.stop()
        thread = self._thread
        if thread is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout):
            await anyio.to_thread.run_sync(thread.join, abandon_on_cancel=True)


__all__ = ["STALL_LEASES", "Heartbeat", "RenewalEnd", "RenewalThread", "Wake",
           "renew_while_held", "renewal_wait", "stall_bound"]
