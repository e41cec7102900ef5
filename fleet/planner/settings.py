"""Knobs of the planner, taken from the fleet YAML (rollout policy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

# Deadline keys: a node state (fleet.contract.signal.SignalState values), plus these two.
PENDING = "Pending"  # signalled, the node has not answered yet
COMPLETING = "Completing"  # the node said Completed; waiting for Ready + the target version


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """``deadlines`` maps a phase key to how long a node may stay in it without progress.

    ``halt_at_failures`` (the fleet YAML's ``rollout.failureBudget``): this many failed
    nodes of one MD/KCP, for its current target version, halt that object's rollout
    (1 = the first failure halts it).
    """

    deadlines: Mapping[str, timedelta] = field(default_factory=dict)
    default_deadline: timedelta = timedelta(minutes=15)
    halt_at_failures: int = 1
    # NodePlan status is written at once when its phase changes; a node step within the
    # phase (Downloading, Cordoning, ...) only once the node has stayed in it this long:
    # quick steps cost no write, and the status never lags a step the node sits in.
    status_settle: timedelta = timedelta(seconds=5)

    def deadline(self, key: str) -> timedelta:
        return self.deadlines.get(key, self.default_deadline)
