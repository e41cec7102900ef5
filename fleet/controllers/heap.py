"""Giving the C heap's free pages back to the system after bursts of work.

A start-up (every cluster's lists decoded at once), a relist or a fleet-wide rollout
allocates far more than the caches keep. CPython returns freed objects to glibc's
malloc, which keeps the freed pages of its main heap mapped as long as anything above
them lives: after a 1000-cluster start-up that is most of the resident memory
(bench/README.md, scale.py). ``malloc_trim(0)`` hands every whole free page back
(``madvise``), wherever it lies. :class:`HeapTrimmer` calls it at most once per
``interval``, when planning passes ran since the last call or when the resident size
grew by more than ``slack`` since the last trim: a burst of watch events that moved no
record (Node churn: thousands of events a second, no planning pass) leaves its freed
pages too (bench/README.md, issue 33). An idle controller does nothing. Elsewhere than
glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import anyio

log = logging.getLogger(__name__)


def _libc_function(name: str) -> Any:
    """A function of the C library (None: no such library or function)."""
    lib = ctypes.util.find_library("c")
    if not lib:
        return None
    try:
        return getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None  # not glibc (musl has neither malloc_trim nor these mallopt options)


# glibc's mallopt parameter (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024  # glibc's own initial threshold


def fixed_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``threshold`` bytes or more by its own ``mmap`` (given
    back to the system when freed), for the process's life; True if set.

    glibc starts with 128 KiB but raises the threshold (up to 32 MiB) whenever such a
    block is freed, so after the first few large transient buffers (a list response's
    body, a page's decoded text, the /status document) every later one is carved from
    the heap instead; live objects allocated in between pin those pages, and the heap's
    resident size grows with every burst (start-up: 1000 clusters' lists). Setting the
    threshold explicitly turns that adjustment off. Elsewhere than glibc: False."""
    mallopt = _libc_function("mallopt")
    if mallopt is None or _libc_function("malloc_trim") is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


def _glibc_trim() -> Callable[[], int] | None:
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _glibc_free() -> Callable[[], int | None]:
    """glibc's free bytes in its heaps (``mallinfo2().fordblks``, glibc 2.33 and later);
    a function answering None elsewhere."""
    mallinfo2 = _libc_function("mallinfo2")
    if mallinfo2 is None:
        return lambda: None
    mallinfo2.argtypes = []
    mallinfo2.restype = _Mallinfo2
    return lambda: int(mallinfo2().fordblks)


def resident_bytes() -> int | None:
    """The process's resident size (``/proc/self/statm``); None where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SLACK = 16 << 20


class HeapTrimmer:
    """``run()`` trims the heap every ``interval`` seconds in which ``work()`` moved, the
    resident size grew by more than ``slack`` bytes over what it was after the last trim
    (``rss``: the resident size now, None: unknown), or the heap's free bytes did
    (``free``: glibc's, None: unknown).

    The last: a burst of Node events that ran no planning pass and outlasted a trim (a
    starved controller worked through its backlog for 30 s at the resident size it
    peaked at, trimmed there) frees most of what it held only after that trim, and the
    resident size, which a free does not lower, never grew again: it stayed at its peak
    for good (bench/README.md, issue 33)."""

    def __init__(self, work: Callable[[], int], *, interval: float = 15.0,
                 trim: Callable[[], int] | None = None,
                 rss: Callable[[], int | None] = resident_bytes,
                 free: Callable[[], int | None] | None = None,
                 slack: int = SLACK) -> None:
        self.work = work
        self.interval = interval
        self._trim = trim if trim is not None else _glibc_trim()
        self._rss = rss
        self._free = free if free is not None else _glibc_free()
        self.slack = slack
        self._seen = -1
        self._floor: int | None = None  # resident size after the last trim (or first look)
        self._free_floor: int | None = None  # free bytes after it (a trim does not lower them)
        self.trims = 0
        self.seconds = 0.0  # spent trimming, over the process's life
        self.released = 0  # bytes of resident size the trims gave back, over its life

    def maybe_trim(self) -> bool:
        """Trim if work was done, or the resident size grew past the slack, since the
        last call; True if it trimmed."""
        done = self.work()
        if self._trim is None:
            return False
        rss = self._rss()
        free = self._free()
        grew = rss is not None and self._floor is not None and rss > self._floor + self.slack
        freed = free is not None and self._free_floor is not None \
            and free > self._free_floor + self.slack
        if done == self._seen and not grew and not freed:
            if self._floor is None or (rss is not None and rss < self._floor):
                self._floor = rss
            if self._free_floor is None or (free is not None and free < self._free_floor):
                self._free_floor = free  # (reused: what is freed from here on counts)
            return False
        self._seen = done
        t0 = time.perf_counter()
        self._trim()
        self.seconds += time.perf_counter() - t0
        self.trims += 1
        after = self._rss()
        if rss is not None and after is not None:
            self.released += max(0, rss - after)
        self._floor = after
        self._free_floor = self._free()
        return True

    async def run(self) -> None:
        if self._trim is None:
            log.debug("malloc_trim not available: the heap is not trimmed")
            return
        while True:
            await anyio.sleep(self.interval)
            self.maybe_trim()
