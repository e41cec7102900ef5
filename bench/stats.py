"""Statistics shared by the benchmarks."""

from __future__ import annotations

import math


def percentile(values: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``values`` by linear interpolation; NaN when empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
