"""HeapTrimmer: trims only after work or growth, and the glibc call is real here."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.controllers.heap import HeapTrimmer, _glibc_trim


def test_trims_only_when_work_moved() -> None:
    work = [0]
    calls: list[int] = []

    def trim() -> int:
        calls.append(work[0])
        return 1

    heap = HeapTrimmer(lambda: work[0], trim=trim, free=lambda: None)
    assert heap.maybe_trim()  # first call: nothing seen yet
    assert not heap.maybe_trim()  # idle: no trim
    assert not heap.maybe_trim()
    work[0] = 3
    assert heap.maybe_trim()
    assert not heap.maybe_trim()
    assert calls == [0, 3]
    assert heap.trims == 2


def test_trims_when_the_resident_size_grew_without_work() -> None:
    """A burst of watch events that moved no record runs no planning pass; the pages
    it freed are given back all the same once the resident size grew past the slack."""
    rss = [100 << 20]
    calls: list[int] = []

    def trim() -> int:
        calls.append(rss[0])
        rss[0] -= 30 << 20  # what the trim gave back
        return 1

    heap = HeapTrimmer(lambda: 0, trim=trim, rss=lambda: rss[0], free=lambda: None,
                       slack=16 << 20)
    assert heap.maybe_trim()  # first call: nothing seen yet (trims, floor 70 MiB)
    assert not heap.maybe_trim()  # idle
    rss[0] += 10 << 20  # within the slack: left alone
    assert not heap.maybe_trim()
    rss[0] += 30 << 20  # 110 MiB: 40 over the floor
    assert heap.maybe_trim()
    assert rss[0] == 80 << 20
    assert not heap.maybe_trim()  # the new floor
    assert calls == [100 << 20, 110 << 20]
    assert heap.released == 60 << 20


def test_trims_when_memory_was_freed_after_a_trim_at_the_peak() -> None:
    """A backlog worked through at the resident size it peaked at (trimmed there) frees
    its memory afterwards: the resident size does not move (a free does not lower it),
    the heap's free bytes do, and the next look trims."""
    rss, free = [400 << 20], [5 << 20]
    calls: list[int] = []

    def trim() -> int:
        calls.append(free[0])
        rss[0] -= max(0, free[0] - (5 << 20))  # whole free pages go back
        return 1

    heap = HeapTrimmer(lambda: 0, trim=trim, rss=lambda: rss[0], free=lambda: free[0],
                       slack=16 << 20)
    assert heap.maybe_trim()  # first look
    rss[0] += 60 << 20  # the burst: grew, trimmed at its peak
    assert heap.maybe_trim()
    assert not heap.maybe_trim()  # still busy at the peak: nothing to give back
    free[0] += 10 << 20  # within the slack: left alone
    assert not heap.maybe_trim()
    free[0] += 90 << 20  # the backlog done: 100 MiB freed, the resident size unmoved
    assert heap.maybe_trim()
    assert rss[0] == 360 << 20
    assert not heap.maybe_trim()  # free bytes stay free after a trim: no trim again
    free[0] -= 50 << 20  # reused
    assert not heap.maybe_trim()
    free[0] += 20 << 20  # 20 MiB freed since: past the slack over the new floor
    assert heap.maybe_trim()
    assert len(calls) == 4


def test_glibc_free_bytes_are_read_here() -> None:
    from fleet.controllers.heap import _glibc_free  # noqa: PLC0415

    free = _glibc_free()()
    if platform.libc_ver()[0] == "glibc":
        assert free is not None and free >= 0


def test_without_malloc_trim_nothing_happens() -> None:
    heap = HeapTrimmer(lambda: 1, trim=None)
    heap._trim = None  # as on a libc without malloc_trim
    assert not heap.maybe_trim()
    assert heap.trims == 0


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_glibc_malloc_trim_is_called() -> None:
    trim = _glibc_trim()
    assert trim is not None
    blobs = [bytes(4096) for _ in range(10_000)]
    del blobs
    assert trim() in (0, 1)  # 1: memory was released, 0: there was none to release


# In a child process (mallopt is process-wide): how many bytes of a 1 MiB allocation
# made after a 4 MiB block was freed are served by their own mmap (glibc's mallinfo2).
# glibc consults the threshold only when the heap's free top cannot serve a request, so
# the top is trimmed first: without that, a top left large by the imports served a block
# from the heap whatever the threshold (the fixed case failed now and then with 0).
_MMAPPED_AFTER_A_LARGE_FREE = """
import ctypes, ctypes.util, sys
from fleet.controllers.heap import fixed_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc_trim.argtypes = [ctypes.c_size_t]
if sys.argv[1] == "fixed":
    assert fixed_mmap_threshold()
big = bytearray(4 << 20)
del big
libc.malloc_trim(0)
before = libc.mallinfo2().hblkhd
block = bytearray(1 << 20)
print(libc.mallinfo2().hblkhd - before)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="mallopt's M_MMAP_THRESHOLD is glibc's")
@pytest.mark.parametrize("mode", ["dynamic", "fixed"])
def test_a_fixed_mmap_threshold_keeps_large_blocks_out_of_the_heap(mode: str) -> None:
    """By default a freed 4 MiB block raises glibc's threshold: the next 1 MiB block
    comes from the heap (where it pins pages); with the threshold fixed it is mapped."""
    out = subprocess.run([sys.executable, "-c", _MMAPPED_AFTER_A_LARGE_FREE, mode],
                         capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    mapped = int(out.stdout.strip())
    if mode == "fixed":
        assert mapped >= 1 << 20
    else:
        assert mapped == 0
