"""The fleet status document: one JSON shape for ``k0s-fleet status --output json`` and
the controller's ``GET /status``.

Built from a gate decision and the cluster progress it was computed from, so what the
status says is exactly what the rollout decides on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fleet.config.schedule import format_duration
from fleet.rollout.gate import GateDecision
from fleet.rollout.progress import ClusterProgress, NodeState, ObjectProgress
from fleet.world.model import ClusterKey, format_time

SCHEMA_VERSION = 1


def _t(t: datetime | None) -> str | None:
    return None if t is None else format_time(t)


def _by_state(states: Sequence[NodeState]) -> dict[str, int]:
    counts = Counter(s.value for s in states)
    return {s.value: counts.get(s.value, 0) for s in NodeState}


def rollout_phase(d: GateDecision) -> str:
    if d.emergency_stop is not None:
        return "Stopped"
    if d.halted is not None:
        return "Halted"
    if d.paused is not None:
        return "Paused"
    if all(w.phase == "Complete" for w in d.waves):
        return "Complete"
    return "Progressing"


def _object(o: ObjectProgress, d: GateDecision, key: ClusterKey) -> dict[str, Any]:
    held = d.hold(key, o.ref) if key in d.allowed_clusters else None
    return {
        "kind": o.ref.kind, "namespace": o.ref.namespace, "name": o.ref.name,
        "target": o.target, "replicas": o.replicas, "upToDate": o.done,
        "complete": o.complete, "halted": o.halted, "paused": o.paused,
        "held": held,
        "nodesByState": _by_state([n.state for n in o.nodes]),
        "nodes": [{"machine": n.machine, "node": n.node, "state": n.state.value,
                   "version": n.version, "phase": n.phase, "message": n.message}
                  for n in o.nodes],
    }


def build_status(decision: GateDecision, clusters: Sequence[ClusterProgress], *,
                 problems: dict[ClusterKey, str] | None = None) -> dict[str, Any]:
    """The status document (plain JSON types only)."""
    d = decision
    problems = problems or {}
    by_key = {c.key: c for c in clusters}
    waves: list[dict[str, Any]] = []
    halted_objects: list[dict[str, Any]] = []
    all_states: list[NodeState] = []
    for w in d.waves:
        cs: list[dict[str, Any]] = []
        for key in w.clusters:
            c = by_key[key]
            g = d.clusters[key]
            states = [n.state for o in c.objects for n in o.nodes]
            all_states.extend(states)
            objects = [_object(o, d, key) for o in c.objects]
            for o, doc in zip(c.objects, objects, strict=True):
                if o.halted or doc["held"] or o.failed:
                    halted_objects.append({
                        "cluster": f"{key[0]}/{key[1]}", "kind": o.ref.kind,
                        "namespace": o.ref.namespace, "name": o.ref.name,
                        "reason": doc["held"] or (
                            f"{o.failed} failed node upgrade(s)"
                            + ("; failure budget exceeded" if o.halted else ""))})
            cs.append({
                "namespace": key[0], "name": key[1], "phase": g.phase.value,
                "allowed": g.allowed, "reason": g.reason or None, "paused": g.paused,
                "observed": c.observed, "problem": problems.get(key),
                "unreachableSince": _t(c.unreachable_since),
                "nodes": c.nodes_total, "upToDate": c.nodes_done,
                "inFlight": c.in_flight, "failed": c.failed,
                "nodesByState": _by_state(states), "objects": objects,
            })
        waves.append({
            "name": w.name, "index": w.index, "canary": w.canary, "phase": w.phase.value,
            "message": w.message, "maxConcurrentClusters": w.max_concurrent,
            "soak": format_duration(w.soak), "failedClusters": w.failed,
            "toleratedFailures": w.tolerated_failures, "clustersComplete": w.complete,
            "clustersUpgrading": w.upgrading, "startedAt": _t(w.started_at),
            "completedAt": _t(w.completed_at), "soakUntil": _t(w.soak_until),
            "clusters": cs,
        })
    total = sum(c.nodes_total for c in clusters)
    done = sum(c.nodes_done for c in clusters)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "generatedAt": format_time(d.now),
        "rollout": {
            "phase": rollout_phase(d), "paused": d.paused, "halted": d.halted,
            "emergencyStop": d.emergency_stop, "nextWakeup": _t(d.next_wakeup),
            "pausedSince": _t(d.state.paused.since if d.state.paused else None),
            "haltedSince": _t(d.state.halted.since if d.state.halted else None),
        },
        "summary": {
            "clusters": len(clusters),
            "clustersComplete": sum(1 for c in clusters if c.complete),
            "clustersAllowed": len(d.allowed_clusters),
            "clustersUnreachable": sum(1 for c in clusters if c.unreachable_since is not None),
            "nodes": total, "nodesUpToDate": done,
            "progress": round(done / total, 4) if total else 1.0,
            "nodesByState": _by_state(all_states),
        },
        "waves": waves,
        "haltedObjects": halted_objects,
    }
