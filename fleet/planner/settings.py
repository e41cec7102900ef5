"""Knobs of the planner, taken from the fleet YAML (rollout policy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

# Deadline keys: a node state (fleet.signal.SignalState values), plus these two.
PENDING = "Pending"  # signalled, the node has not answered yet
COMPLETING = "Completing"  # the node said Completed; waiting for Ready + the target version


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """``deadlines`` maps a phase key to how long a node may stay in it without progress.

    ``failure_budget`` is how many failed nodes an MD/KCP tolerates for one target version;
    one more halts its rollout.
    """

    deadlines: Mapping[str, timedelta] = field(default_factory=dict)
    default_deadline: timedelta = timedelta(minutes=15)
    failure_budget: int = 0

    def deadline(self, key: str) -> timedelta:
        return self.deadlines.get(key, self.default_deadline)
