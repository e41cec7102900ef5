"""Item 2 of issue #12 (pure part): a workload cluster marked unreachable.

The controller marks a cluster unreachable (ClusterInfo.unreachable_since, Nodes unknown)
when its Node watch has failed for a bounded time; here the planner, the gate and the
status document are checked for what they make of it.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest

from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import (
    CreateNodePlan,
    MarkNodePlanFailed,
    SetRolloutStatus,
    SignalNode,
    UpdateNodePlanStatus,
)
from fleet.planner.conditions import PROGRESSING, R_CLUSTER_UNREACHABLE
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import clusters_from_snapshot
from fleet.status.metrics import FleetMetrics
from fleet.status.model import build_status
from tests.helpers.gate import T0, config

V2 = "v1.31.3+k0s.0"


def _in_flight() -> tuple[SimFleet, tuple[str, str]]:
    sim = SimFleet(now=T0)
    key = add_cluster(sim, "c", namespace="fleet", control_planes=0, workers=2)
    bump(sim, key, V2)
    for _ in range(3):
        sim.apply_all(plan(sim.snapshot(), PlannerSettings()).actions)
    [(ckey, node)] = sim.active_requests()[:1]
    sim.step_node(ckey, node)  # the agent is Downloading
    sim.apply_all(plan(sim.snapshot(), PlannerSettings()).actions)
    return sim, key


def _go_down(sim: SimFleet, key: tuple[str, str]) -> None:
    sim.nodes[key] = None
    sim.clusters[key] = dataclasses.replace(
        sim.clusters[key], unreachable_since=sim.now, unreachable_error="connection refused")


def test_in_flight_plan_keeps_its_state_and_says_unreachable_since() -> None:
    sim, key = _in_flight()
    [p] = [p for p in sim.nodeplans.values() if p.node_state]
    before = p.node_state
    down_at = sim.now
    _go_down(sim, key)
    sim.advance(5)
    actions = plan(sim.snapshot(), PlannerSettings()).actions
    updates = [a for a in actions if isinstance(a, UpdateNodePlanStatus)]
    assert updates, actions
    u = updates[0]
    assert u.node_state == before  # not reset to Pending: nothing is known
    assert "unreachable since" in u.message and "connection refused" in u.message
    assert down_at.strftime("%Y-%m-%dT%H:%M:%S") in u.message
    statuses = [a for a in actions if isinstance(a, SetRolloutStatus)]
    assert statuses and any(c.type == PROGRESSING and c.reason == R_CLUSTER_UNREACHABLE
                            for c in statuses[0].conditions)
    sim.apply_all(actions)
    # Its deadline still runs; when it fires it names the outage, not the node.
    sim.advance(timedelta(hours=2).total_seconds())
    failed = [a for a in plan(sim.snapshot(), PlannerSettings()).actions
              if isinstance(a, MarkNodePlanFailed)]
    assert failed and "unreachable since" in failed[0].message


def test_nothing_new_starts_and_status_and_metric_say_unreachable() -> None:
    sim = SimFleet(now=T0)
    key = add_cluster(sim, "c", namespace="fleet", control_planes=1, workers=2)
    bump(sim, key, V2)
    _go_down(sim, key)
    snap = sim.snapshot()
    starts = [a for a in plan(snap, PlannerSettings()).actions
              if isinstance(a, CreateNodePlan | SignalNode)]
    assert starts == []
    [progress] = clusters_from_snapshot(snap)
    decision = RolloutGate(config()).evaluate(FleetView([progress]), T0)
    assert key not in decision.allowed_clusters
    assert "unreachable since" in decision.reasons[key]
    doc = build_status(decision, [progress])
    row = doc["waves"][0]["clusters"][0]
    assert row["unreachableSince"] is not None
    assert doc["summary"]["clustersUnreachable"] == 1
    metrics = FleetMetrics(registry := CollectorRegistry())
    metrics.update_from_status(doc)
    text = generate_latest(registry).decode()
    assert 'k0s_fleet_cluster_unreachable{cluster="fleet/c"} 1.0' in text
    # It answers again: the row and the metric clear.
    sim.clusters[key] = dataclasses.replace(sim.clusters[key], unreachable_since=None)
    sim.nodes[key] = {}
    [progress] = clusters_from_snapshot(sim.snapshot())
    doc = build_status(RolloutGate(config()).evaluate(FleetView([progress]), T0), [progress])
    metrics.update_from_status(doc)
    assert 'k0s_fleet_cluster_unreachable{cluster="fleet/c"}' not in \
        generate_latest(registry).decode()
