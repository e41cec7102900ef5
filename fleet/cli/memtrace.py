"""Memory tracing for measurements (``K0S_FLEET_TRACEMALLOC``), off unless asked for.

``K0S_FLEET_TRACEMALLOC=/path/out.txt`` (optionally ``K0S_FLEET_TRACEMALLOC_FRAMES``,
default 8): the process traces its allocations with :mod:`tracemalloc` from start-up and,
on ``SIGUSR2``, writes the largest live allocations, grouped by the innermost frame of
the project's own code and by the full traceback, to that file (replaced each time).
Tracing costs CPU and roughly doubles the memory of small objects: for finding where
memory goes (bench/README.md), never for production numbers.
"""

from __future__ import annotations

import os
import signal
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

ENV = "K0S_FLEET_TRACEMALLOC"
FRAMES_ENV = "K0S_FLEET_TRACEMALLOC_FRAMES"
TOP = 60


def _owner(tb: tracemalloc.Traceback) -> str:
    """The innermost frame in the project's code (else the innermost frame)."""
    for frame in reversed(tb):  # a Traceback lists the oldest frame first
        if "/fleet/" in frame.filename:
            return f"{frame.filename.split('/fleet/', 1)[1]}:{frame.lineno}"
    f = tb[-1] if len(tb) else None
    return f"{f.filename}:{f.lineno}" if f is not None else "?"


def report(path: Path) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),))
    stats = snapshot.statistics("traceback")
    total = sum(s.size for s in stats)
    by_owner: Counter[str] = Counter()
    for s in stats:
        by_owner[_owner(s.traceback)] += s.size
    _, peak = tracemalloc.get_traced_memory()
    lines = [f"traced {total / 2**20:.1f} MiB in {sum(s.count for s in stats)} blocks "
             f"(peak since tracing began: {peak / 2**20:.1f} MiB)",
             "", f"by the innermost project frame (top {TOP}):"]
    lines += [f"{size / 2**20:9.2f} MiB  {owner}" for owner, size in by_owner.most_common(TOP)]
    lines += ["", f"by traceback (top {TOP // 2}):"]
    for s in stats[:TOP // 2]:
        lines.append(f"{s.size / 2**20:9.2f} MiB in {s.count} blocks")
        lines += [f"    {f.filename}:{f.lineno}" for f in s.traceback]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)


def install_from_environment() -> None:
    """Start tracing and the SIGUSR2 handler if ``K0S_FLEET_TRACEMALLOC`` names a file."""
    target = os.environ.get(ENV)
    if not target:
        return
    frames = int(os.environ.get(FRAMES_ENV) or 8)
    tracemalloc.start(frames)
    path = Path(target)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        report(path)

    signal.signal(signal.SIGUSR2, on_signal)
