"""How long CPython's garbage collector stops the controller's one event loop.

A collection of the oldest generation walks every container object the process keeps
(the caches of a 1000-cluster fleet hold hundreds of thousands), with the event loop
stopped for its whole length: every request, watch event and planning pass waits.
:class:`GcPauses` times each collection (``gc.callbacks``), keeps the count and the
longest per generation, and logs a collection that took longer than ``log_over``.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class GcPauses:
    def __init__(self, *, log_over: float = 0.1,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.log_over = log_over
        self.clock = clock
        self.collections = [0, 0, 0]
        self.longest = [0.0, 0.0, 0.0]
        self.paused = [0.0, 0.0, 0.0]  # per generation, over the process's life
        self.seconds = 0.0  # paused, over the process's life
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self.clock()
            return
        if self._started is None:
            return
        took, self._started = self.clock() - self._started, None
        gen = int(info.get("generation", 2))
        self.collections[gen] += 1
        self.longest[gen] = max(self.longest[gen], took)
        self.paused[gen] += took
        self.seconds += took
        if took >= self.log_over:
            log.info("garbage collection of generation %d stopped the controller for "
                     "%.0f ms (%d objects freed)", gen, took * 1000,
                     int(info.get("collected", 0)))

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def freeze_survivors() -> int:
    """Leave every object alive now out of later collections (``gc.freeze``); the number
    of objects moved. Called once the controller's first pass has run: what the start-up
    built (caches, clients, parsed fleet config) lives as long as the process, and each
    collection of the oldest generation otherwise walks all of it again. Objects frozen
    are still freed when their last reference goes; only a reference cycle among them
    would be kept (none is known in the caches)."""
    gc.freeze()
    return gc.get_freeze_count()
