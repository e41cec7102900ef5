"""Prometheus metrics of the fleet, in a registry passed in explicitly (never the global).

Gauges are set from the status document (so /metrics and /status never disagree);
counters and histograms are fed from the planner's actions by the controller
(:meth:`FleetMetrics.observe_actions`), with the snapshot they were computed from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleet.nodeplan import NodePlanPhase
from fleet.planner.actions import (
    Action,
    CreateNodePlan,
    MarkNodePlanFailed,
    RetryNodePlan,
    UpdateNodePlanStatus,
)
from fleet.rollout.progress import NodeState

PHASE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
UPGRADE_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
ROLLOUT_PHASES = ("Progressing", "Paused", "Halted", "Stopped", "Complete")
WAVE_PHASES = ("Pending", "Progressing", "Soaking", "Complete", "Halted")
CLUSTER_PHASES = ("Complete", "Upgrading", "Queued", "Failed", "Waiting")


class FleetMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.nodes = Gauge("k0s_fleet_nodes", "Nodes of the fleet by upgrade state.",
                           ["state"], registry=r)
        self.clusters = Gauge("k0s_fleet_clusters", "Clusters of the fleet by rollout phase.",
                              ["phase"], registry=r)
        self.progress = Gauge("k0s_fleet_rollout_progress_ratio",
                              "Share of the fleet's nodes on their target version and Ready.",
                              registry=r)
        self.rollout_phase = Gauge("k0s_fleet_rollout_phase",
                                   "1 for the fleet rollout's current phase.", ["phase"],
                                   registry=r)
        self.wave_progress = Gauge("k0s_fleet_wave_progress_ratio",
                                   "Share of a wave's clusters that are complete.", ["wave"],
                                   registry=r)
        self.wave_phase = Gauge("k0s_fleet_wave_phase", "1 for each wave's current phase.",
                                ["wave", "phase"], registry=r)
        self.started = Counter("k0s_fleet_node_upgrades_started",
                               "Node upgrades dispatched (NodePlans created or retried).",
                               ["role"], registry=r)
        self.completed = Counter("k0s_fleet_node_upgrades_completed",
                                 "Node upgrades completed (node on target and Ready).",
                                 registry=r)
        self.failed = Counter("k0s_fleet_node_upgrades_failed",
                              "Node upgrades failed (node failure or missed deadline).",
                              ["reason"], registry=r)
        self.phase_seconds = Histogram("k0s_fleet_node_phase_duration_seconds",
                                       "Time a node upgrade spent in one phase.", ["phase"],
                                       buckets=PHASE_BUCKETS, registry=r)
        self.upgrade_seconds = Histogram("k0s_fleet_node_upgrade_duration_seconds",
                                         "Time from dispatch to completion of a node upgrade.",
                                         buckets=UPGRADE_BUCKETS, registry=r)
        self._waves: set[str] = set()

    # -- gauges from the status document ---------------------------------------------------
    def update_from_status(self, doc: Mapping[str, Any]) -> None:
        summary = doc["summary"]
        for state in NodeState:
            self.nodes.labels(state.value).set(summary["nodesByState"].get(state.value, 0))
        phases = [c["phase"] for w in doc["waves"] for c in w["clusters"]]
        for p in CLUSTER_PHASES:
            self.clusters.labels(p).set(phases.count(p))
        self.progress.set(summary["progress"])
        for p in ROLLOUT_PHASES:
            self.rollout_phase.labels(p).set(1 if doc["rollout"]["phase"] == p else 0)
        seen: set[str] = set()
        for w in doc["waves"]:
            name = w["name"]
            seen.add(name)
            n = len(w["clusters"])
            self.wave_progress.labels(name).set(w["clustersComplete"] / n if n else 1.0)
            for p in WAVE_PHASES:
                self.wave_phase.labels(name, p).set(1 if w["phase"] == p else 0)
        for gone in self._waves - seen:
            self.wave_progress.remove(gone)
            for p in WAVE_PHASES:
                self.wave_phase.remove(gone, p)
        self._waves = seen

    # -- counters and histograms from planner actions ---------------------------------------
    def observe_actions(self, actions: Iterable[Action], nodeplans: Mapping[Any, Any]) -> None:
        """Count what one planning pass did. ``nodeplans`` is the snapshot's NodePlans
        (keyed by (namespace, name)) the actions were computed from."""
        for a in actions:
            if isinstance(a, CreateNodePlan):
                self.started.labels(a.role).inc()
            elif isinstance(a, RetryNodePlan):
                p = nodeplans.get((a.plan.namespace, a.plan.name))
                self.started.labels(getattr(p, "role", "worker")).inc()
            elif isinstance(a, MarkNodePlanFailed):
                self.failed.labels("deadline" if a.deadline else "node").inc()
            elif isinstance(a, UpdateNodePlanStatus):
                p = nodeplans.get((a.plan.namespace, a.plan.name))
                if p is None:
                    continue
                if a.node_state != p.node_state and p.phase_since is not None \
                        and a.phase_since is not None:
                    self.phase_seconds.labels(p.node_state or "Pending").observe(
                        max(0.0, (a.phase_since - p.phase_since).total_seconds()))
                if a.phase == NodePlanPhase.COMPLETED and p.phase != NodePlanPhase.COMPLETED:
                    self.completed.inc()
                    if p.started_at is not None and a.completed_at is not None:
                        self.upgrade_seconds.observe(
                            max(0.0, (a.completed_at - p.started_at).total_seconds()))
