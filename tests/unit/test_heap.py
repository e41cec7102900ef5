"""HeapTrimmer: trims only after work, and the glibc call is real here."""

from __future__ import annotations

import platform

import pytest

from fleet.controllers.heap import HeapTrimmer, _glibc_trim


def test_trims_only_when_work_moved() -> None:
    work = [0]
    calls: list[int] = []

    def trim() -> int:
        calls.append(work[0])
        return 1

    heap = HeapTrimmer(lambda: work[0], trim=trim)
    assert heap.maybe_trim()  # first call: nothing seen yet
    assert not heap.maybe_trim()  # idle: no trim
    assert not heap.maybe_trim()
    work[0] = 3
    assert heap.maybe_trim()
    assert not heap.maybe_trim()
    assert calls == [0, 3]
    assert heap.trims == 2


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
