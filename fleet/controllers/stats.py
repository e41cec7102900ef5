"""The control loop's counters (passes, actions, errors, reaction times), read by tests,
benchmarks and the status endpoints."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class ControllerStats:
    passes: int = 0
    actions: int = 0
    errors: int = 0
    plan_seconds: float = 0.0
    clusters_planned: int = 0  # summed over passes (a pass plans the clusters that moved)
    last_pass: datetime | None = None
    # Seconds from the change that woke a pass to its dispatches being sent (the
    # controller's own share of "one node completes -> the next one starts").
    dispatch_reaction: list[float] = field(default_factory=list)
    by_type: dict[str, int] = field(default_factory=lambda: defaultdict(int))
