"""Simulated fleets for planner tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleet.planner import PENDING, PlannerSettings, plan
from fleet.planner.actions import (
    Action,
)
from fleet.planner.simulate import SimFleet, add_cluster
from fleet.world.model import (
    ClusterKey,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"


SETTINGS = PlannerSettings(deadlines={PENDING: timedelta(seconds=30)},
                           default_deadline=timedelta(seconds=120), halt_at_failures=1)


def fleet(**kw: object) -> tuple[SimFleet, ClusterKey]:
    sim = SimFleet(now=T0)
    return sim, add_cluster(sim, "c1", **kw)  # type: ignore[arg-type]


def of(actions: list[Action], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


def step(sim: SimFleet, settings: PlannerSettings = SETTINGS) -> list[Action]:
    result = plan(sim.snapshot(), settings)
    sim.apply_all(result.actions)
    return result.actions
