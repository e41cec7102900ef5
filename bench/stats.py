"""Statistics shared by the benchmarks."""

from __future__ import annotations

import gc
import json
import math
import time
from pathlib import Path
from typing import Any


def percentile(values: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``values`` by linear interpolation; NaN when empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def record_gc_pauses() -> list[tuple[float, int, float]]:
    """From now on, every garbage collection of this process, appended as it ends:
    (wall-clock time, generation, seconds paused), by ``gc.callbacks``."""
    pauses: list[tuple[float, int, float]] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            pauses.append((time.time(), int(info.get("generation", 2)),
                           time.perf_counter() - started[0]))

    gc.callbacks.append(on_gc)
    return pauses


def report(result: Any, json_path: str | None, *, indent: int = 1) -> int:
    """Print a benchmark's result as JSON, and write it to ``json_path`` if given; 0."""
    text = json.dumps(result, indent=indent)
    print(text)
    if json_path:
        Path(json_path).write_text(text)
    return 0
