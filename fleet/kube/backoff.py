"""Jittered exponential backoff, the one retry pacing used across the project."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float = 0.05
    maximum: float = 5.0
    factor: float = 2.0
    _next: float = field(default=0.0, init=False)

    def next_delay(self) -> float:
        """Full-jitter delay: uniform in [0, current cap], cap grows geometrically."""
        cap = self._next or self.initial
        self._next = min(self.maximum, cap * self.factor)
        return random.uniform(cap / 2, cap)

    def reset(self) -> None:
        self._next = 0.0
