"""The controller's event loop: at most a few sockets' reads per turn.

asyncio's selector asks epoll for every ready socket at once and runs all their callbacks
in one turn of the loop before any task it woke. A controller watching the Nodes of 1000
workload clusters gets one patch of a shared Node as 1000 readable sockets at once: the
reads (decryption, the lines handed to the caches) took 50-100 ms, and the planning pass
woken by a rolling cluster's answer, a probe, a lease renewal's result waited behind all
of them (bench/README.md, issue 33: hand-offs of a rollout at p99 150 ms).

:class:`FairEpollSelector` asks epoll for at most :data:`READY_PER_TURN` sockets a turn.
Epoll is level-triggered here, and it hands ready sockets out in the order they became
ready, putting one it handed out back at the end while still readable: the rest come in
the next turns, in order, and what the earlier reads woke runs in between. A burst costs
a few more ``epoll_wait`` calls, each returning many sockets; nothing else changes.
"""

from __future__ import annotations

import asyncio
import math
import select
import selectors

READY_PER_TURN = 64


class FairEpollSelector(selectors.EpollSelector):
    """An EpollSelector that returns at most ``ready_per_turn`` ready sockets a call."""

    def __init__(self, ready_per_turn: int = READY_PER_TURN) -> None:
        if ready_per_turn < 1:
            raise ValueError(f"ready_per_turn must be at least 1, got {ready_per_turn}")
        super().__init__()
        self.ready_per_turn = ready_per_turn
        self.calls = 0  # epoll_wait calls (tests, benchmarks)

    def select(self, timeout: float | None = None
               ) -> list[tuple[selectors.SelectorKey, int]]:
        # selectors.EpollSelector.select, but for the number of events asked of epoll
        if timeout is None:
            wait = -1.0
        elif timeout <= 0:
            wait = 0.0
        else:  # epoll's resolution is a millisecond: round up, wait at least timeout
            wait = math.ceil(timeout * 1e3) * 1e-3
        self.calls += 1
        ready: list[tuple[selectors.SelectorKey, int]] = []
        try:
            fd_events = self._selector.poll(wait, self.ready_per_turn)  # type: ignore[attr-defined]
        except InterruptedError:
            return ready
        for fd, event in fd_events:
            events = 0
            if event & ~select.EPOLLIN:
                events |= selectors.EVENT_WRITE
            if event & ~select.EPOLLOUT:
                events |= selectors.EVENT_READ
            key = self._key_from_fd(fd)  # type: ignore[attr-defined]
            if key:
                ready.append((key, events & key.events))
        return ready


def new_event_loop(ready_per_turn: int = READY_PER_TURN) -> asyncio.AbstractEventLoop:
    """An asyncio event loop on :class:`FairEpollSelector` (the controller's:
    ``anyio.run(..., backend_options={"loop_factory": new_event_loop})``)."""
    return asyncio.SelectorEventLoop(FairEpollSelector(ready_per_turn))
