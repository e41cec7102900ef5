"""Prometheus metrics of the fleet, in a registry passed in explicitly (never the global).

Gauges are set from the status document (so /metrics and /status never disagree);
counters and histograms from the NodePlans observed in each snapshot
(:meth:`FleetMetrics.observe_nodeplans`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleet.contract.nodeplan import NodePlanPhase
from fleet.planner.conditions import R_DEADLINE
from fleet.rollout.progress import NodeState
from fleet.world.model import NodePlanInfo

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
        self._unreachable: set[str] = set()
        self.cluster_unreachable = Gauge(
            "k0s_fleet_cluster_unreachable",
            "1 for each workload cluster whose API server has stopped answering "
            "(nothing new starts there until it answers again).", ["cluster"], registry=r)
        self.clusters_unreachable = Gauge(
            "k0s_fleet_clusters_unreachable", "Workload clusters not answering.", registry=r)
        self._seeded = False
        self._started: set[tuple[str, str, int]] = set()
        self._done: set[tuple[str, str, int]] = set()
        self._phase: dict[tuple[str, str, int], tuple[str, datetime | None]] = {}

    # -- gauges from the status document ---------------------------------------------------
    def update_from_status(self, doc: Mapping[str, Any]) -> None:
        summary = doc["summary"]
        for state in NodeState:
            self.nodes.labels(state.value).set(summary["nodesByState"].get(state.value, 0))
        phases = [c["phase"] for w in doc["waves"] for c in w["clusters"]]
        for p in CLUSTER_PHASES:
            self.clusters.labels(p).set(phases.count(p))
        self.progress.set(summary["progress"])
        unreachable = {f'{c["namespace"]}/{c["name"]}' for w in doc["waves"]
                       for c in w["clusters"] if c.get("unreachableSince")}
        for name in self._unreachable - unreachable:
            self.cluster_unreachable.remove(name)
        for name in unreachable:
            self.cluster_unreachable.labels(name).set(1)
        self._unreachable = unreachable
        self.clusters_unreachable.set(len(unreachable))
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

    # -- counters and histograms from observed NodePlans -----------------------------------
    def observe_nodeplans(self, nodeplans: Iterable[NodePlanInfo]) -> None:
        """Count transitions of NodePlans as observed pass after pass.

        Observation-based (not from the planner's actions, which a controller acting in
        the background may repeat): each NodePlan attempt counts once as started,
        completed or failed, and each phase it leaves is timed from its ``phaseSince``.
        The first call only learns what exists, so a restart does not count history.
        """
        seeding = not self._seeded
        self._seeded = True
        for p in nodeplans:
            key = (p.ref.namespace, p.ref.name, max(1, p.attempts))
            if p.started_at is not None and key not in self._started:
                self._started.add(key)
                if not seeding:
                    self.started.labels(p.role or "worker").inc()
            if p.phase == NodePlanPhase.COMPLETED and key not in self._done:
                self._done.add(key)
                if not seeding:
                    self.completed.inc()
                    if p.started_at is not None and p.completed_at is not None:
                        self.upgrade_seconds.observe(
                            max(0.0, (p.completed_at - p.started_at).total_seconds()))
            elif p.phase == NodePlanPhase.FAILED and key not in self._done:
                self._done.add(key)
                if not seeding:
                    self.failed.labels(
                        "deadline" if p.reason == R_DEADLINE else "node").inc()
            prev = self._phase.get(key)
            current = (p.node_state or "Pending", p.phase_since)
            if prev is not None and prev[0] != current[0] and prev[1] is not None \
                    and current[1] is not None and not seeding:
                self.phase_seconds.labels(prev[0]).observe(
                    max(0.0, (current[1] - prev[1]).total_seconds()))
            if p.terminal:
                self._phase.pop(key, None)
            else:
                self._phase[key] = current
