"""What the node's drain did with each pod reaches the NodePlan's status (issue #31):
the planner carries the agent's status.drain into the Completed or Failed status write
(pure: the simulated fleet of fleet.planner.simulate)."""

from __future__ import annotations

import dataclasses

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import SignalState
from fleet.planner import plan
from fleet.planner.actions import MarkNodePlanFailed, UpdateNodePlanStatus
from fleet.planner.simulate import SimFleet, bump
from fleet.world.model import ClusterKey
from tests.helpers.planner import SETTINGS, V2, fleet, of, step

OUTCOMES = ("app/web: evicted", "app/logs: left running: MachineDrainRule keep: Skip")


def _dispatched() -> tuple[SimFleet, ClusterKey]:
    sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1)
    bump(sim, ck, V2)
    for _ in range(20):  # until the node is signalled and nothing more changes
        if not plan(sim.snapshot(), SETTINGS).actions:
            break
        step(sim)
    return sim, ck


def _say_drain(sim: SimFleet, ck: ClusterKey, name: str) -> None:
    nodes = sim.nodes[ck]
    assert nodes is not None
    n = nodes[name]
    assert n.signal is not None and n.signal.status is not None
    nodes[name] = dataclasses.replace(n, signal=n.signal.with_status(
        n.signal.status.model_copy(update={"drain": OUTCOMES})))


def test_a_completed_node_plan_names_each_pods_outcome() -> None:
    sim, ck = _dispatched()
    sim.finish_node(ck, "c1-md-0")
    _say_drain(sim, ck, "c1-md-0")
    [done] = [a for a in of(step(sim), UpdateNodePlanStatus)
              if a.phase == NodePlanPhase.COMPLETED]
    assert done.drain == OUTCOMES


def test_a_failed_drain_names_each_pods_outcome() -> None:
    sim, ck = _dispatched()
    sim.step_node(ck, "c1-md-0")
    sim.step_node(ck, "c1-md-0", fail=SignalState.FAILED_DRAIN)
    _say_drain(sim, ck, "c1-md-0")
    [failed] = of(step(sim), MarkNodePlanFailed)
    assert failed.drain == OUTCOMES
