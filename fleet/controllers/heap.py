"""Giving the C heap's free pages back to the system after bursts of work.

A start-up (every cluster's lists decoded at once), a relist or a fleet-wide rollout
allocates far more than the caches keep. CPython returns freed objects to glibc's
malloc, which keeps the freed pages of its main heap mapped as long as anything above
them lives: after a 1000-cluster start-up that is most of the resident memory
(bench/README.md, scale.py). ``malloc_trim(0)`` hands every whole free page back
(``madvise``), wherever it lies. :class:`HeapTrimmer` calls it at most once per
``interval`` and only when planning passes ran since the last call, so an idle
controller does nothing. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

import anyio

log = logging.getLogger(__name__)


def _glibc_trim() -> Callable[[], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (musl has no malloc_trim)
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


class HeapTrimmer:
    """``run()`` trims the heap every ``interval`` seconds in which ``work()`` moved."""

    def __init__(self, work: Callable[[], int], *, interval: float = 60.0,
                 trim: Callable[[], int] | None = None) -> None:
        self.work = work
        self.interval = interval
        self._trim = trim if trim is not None else _glibc_trim()
        self._seen = -1
        self.trims = 0
        self.seconds = 0.0  # spent trimming, over the process's life

    def maybe_trim(self) -> bool:
        """Trim if work was done since the last call; True if it trimmed."""
        done = self.work()
        if self._trim is None or done == self._seen:
            return False
        self._seen = done
        t0 = time.perf_counter()
        self._trim()
        self.seconds += time.perf_counter() - t0
        self.trims += 1
        return True

    async def run(self) -> None:
        if self._trim is None:
            log.debug("malloc_trim not available: the heap is not trimmed")
            return
        while True:
            await anyio.sleep(self.interval)
            self.maybe_trim()
