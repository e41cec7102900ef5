"""``k0s-fleet plan``: what the rollout would do from here, computed without writing.

The dry run replays the real decision code on an in-memory copy of the observed fleet:
every pass evaluates the wave gate (fleet.rollout.gate) and the controller's planner
(fleet.planner) with the gate's ``hold`` (exactly as the controller calls it),
and lets fleet.planner.simulate play the nodes along the agent's happy path, one phase
per ``node_duration / phases``. So the order printed is the order the controller takes
as long as every node succeeds at that pace; soaks and maintenance windows are waited
out on the simulated clock, and what can never start (paused, halted, left to Cluster
API, unreachable) is reported as blocked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fleet.config.models import DEFAULT_WAVE_NAME, FleetConfig
from fleet.config.schedule import format_duration
from fleet.contract.signal import HAPPY_PATH
from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import (
    Action,
    CreateNodePlan,
    HaltObject,
    RecordEvent,
    ReportNotInPlace,
    ReportOtherDriver,
    ReportVersionConflict,
    SetRolloutStatus,
)
from fleet.planner.simulate import SimFleet
from fleet.planner.writer import EXTENSION_HOLD_REASON, ExtensionDrives, executor_of
from fleet.rollout.gate import FleetView, GateDecision, RolloutGate, WavePhase
from fleet.rollout.observe import Observation
from fleet.rollout.progress import ClusterProgress, NodeState, clusters_from_snapshot
from fleet.world.model import (
    EXECUTOR_AGENT,
    ClusterKey,
    ControlPlaneInfo,
    IntentTarget,
    MachineDeploymentInfo,
    ObjectRef,
    format_time,
)

_QUIET = (SetRolloutStatus, RecordEvent, ReportNotInPlace, HaltObject, ReportVersionConflict,
          ReportOtherDriver)


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One dispatch: nodes of one object started together."""

    at: datetime
    cluster: ClusterKey
    wave: str
    owner: ObjectRef
    nodes: tuple[str, ...]
    unavailable: int  # nodes of the object unavailable once these started
    max_unavailable: int


@dataclass
class DryRun:
    start: datetime
    decision: GateDecision  # the gate's answer right now
    clusters: list[ClusterProgress]  # progress right now
    steps: list[PlanStep] = field(default_factory=list)
    end: datetime | None = None  # when the last node would finish (None: blocked)
    blocked: dict[ClusterKey, str] = field(default_factory=dict)
    waiting: dict[ObjectRef, str] = field(default_factory=dict)
    executors: dict[ObjectRef, tuple[str, str]] = field(default_factory=dict)
    # per cluster a FleetUpgrade decides: its rung, the rungs after it and its version, or
    # why k0s's skew rules refuse it (as the controller decides it now)
    intents: Mapping[ClusterKey, IntentTarget] = field(default_factory=dict)
    # control-plane Machines (namespace, name) whose infrastructure Machine the reader was
    # refused (its RBAC, not the controller's): whether they go in place cannot be told
    cannot_tell: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def duration(self) -> timedelta | None:
        return None if self.end is None else self.end - self.start


def _with_extension(decision: GateDecision, extension: frozenset[ClusterKey]
                    ) -> Callable[[ClusterKey, ObjectRef], str | None]:
    if not extension:
        return decision.hold

    def hold(cluster: ClusterKey, owner: ObjectRef) -> str | None:
        inner = decision.hold(cluster, owner)
        return ExtensionDrives(EXTENSION_HOLD_REASON, inner) if cluster in extension else inner

    return hold


def _planner_settings(config: FleetConfig) -> PlannerSettings:
    return PlannerSettings(halt_at_failures=config.rollout.failure_budget)


def dry_run(obs: Observation, config: FleetConfig, *, now: datetime,
            node_duration: timedelta = timedelta(minutes=3),
            max_passes: int = 20000) -> DryRun:
    snap = obs.snapshot
    sim = SimFleet(
        now=now,
        # The simulator plays the agent protocol; the order does not depend on it.
        clusters={k: dataclasses.replace(v, executor=EXECUTOR_AGENT)
                  for k, v in snap.clusters.items()},
        # The objects as they are written (the simulator lays the FleetUpgrades over them
        # on every pass, and plays the controller's version writes).
        deployments={k: dataclasses.replace(o, version=o.object_version, spec_version=None,
                                            intent=None)
                     for k, o in snap.deployments.items()},
        machine_sets=dict(snap.machine_sets),
        control_planes={k: dataclasses.replace(o, version=o.object_version, spec_version=None,
                                               intent=None)
                        for k, o in snap.control_planes.items()},
        machines=dict(snap.machines), nodeplans=dict(snap.nodeplans),
        nodes={k: (None if v is None else dict(v)) for k, v in snap.nodes.items()},
        upgrades=dict(snap.upgrades), autopilot_plans=dict(snap.autopilot_plans),
        catalog=config.download.catalog())
    owners: list[MachineDeploymentInfo | ControlPlaneInfo] = [
        *snap.deployments.values(), *snap.control_planes.values()]
    extension = obs.extension_clusters
    executors = {ObjectRef(o.ref.kind, o.ref.namespace, o.ref.name): executor_of(
        o, capi_drives=(o.ref.namespace, o.cluster) in extension) for o in owners}
    cannot_tell = {k: m.infra.error or "refused" for k, m in snap.machines.items()
                   if m.infra is not None and m.infra.denied}
    gate = RolloutGate(config)
    settings = _planner_settings(config)
    phase_time = node_duration / len(HAPPY_PATH)
    state = obs.state
    result: DryRun | None = None
    last: GateDecision | None = None
    progress: list[ClusterProgress] = []
    for _ in range(max_passes):
        snapshot = dataclasses.replace(sim.snapshot(), now=sim.now)
        progress = clusters_from_snapshot(snapshot)
        decision = gate.evaluate(FleetView(progress, obs.controls, state), sim.now)
        state = decision.state
        last = decision
        if result is None:
            result = DryRun(start=now, decision=decision, clusters=progress,
                            executors=executors, intents=snapshot.intents,
                            cannot_tell=cannot_tell)
        if all(c.complete for c in progress):
            result.end = sim.now
            break
        # The controller's own call: the gate's hold is the planner's hold (with the
        # extension exclusion laid over it, as `k0s-fleet controller` does).
        planned = plan(snapshot, settings, hold=_with_extension(decision, extension))
        actions: list[Action] = list(planned.actions)
        by_owner: dict[ObjectRef, list[CreateNodePlan]] = {}
        for a in actions:
            if isinstance(a, CreateNodePlan):
                by_owner.setdefault(a.owner, []).append(a)
        for d in planned.decisions:
            creates = by_owner.get(d.owner)
            if not creates:
                if d.waiting:
                    result.waiting[d.owner] = d.waiting
                continue
            result.waiting.pop(d.owner, None)
            key = creates[0].cluster
            result.steps.append(PlanStep(
                at=sim.now, cluster=key, wave=decision.clusters[key].wave
                if key in decision.clusters else "", owner=d.owner,
                nodes=tuple(a.node for a in creates), unavailable=d.unavailable,
                max_unavailable=d.max_unavailable))
        sim.apply_all(actions)
        moving = [a for a in actions if not isinstance(a, _QUIET)]
        active = sim.active_requests()
        if active:
            for ckey, node in active:
                sim.step_node(ckey, node)
            sim.advance(phase_time.total_seconds())
        elif not moving:
            if decision.next_wakeup is None:
                break  # blocked for good (paused, halted, left to Cluster API, ...)
            sim.now = max(sim.now, decision.next_wakeup)
    assert result is not None
    if result.end is None and last is not None:
        result.blocked = {c.key: last.reasons.get(c.key, "")
                          or _stuck(c, result.waiting, cannot_tell) for c in progress
                          if not c.complete}
    for key, t in result.intents.items():
        if t.refusal is not None:  # nothing moves there: the sim saw it "complete"
            result.blocked[key] = f"refused by k0s's version skew policy: {t.refusal[0]}: " \
                                  f"{t.refusal[1]}"
            result.end = None
    return result


CANNOT_TELL = "cannot tell (infrastructure machine not readable by you: {why})"


def _stuck(c: ClusterProgress, waiting: Mapping[ObjectRef, str],
           cannot_tell: Mapping[tuple[str, str], str]) -> str:
    """Why a cluster the gate admits gets no further: per object not done, its nodes left
    to Cluster API (or unknown), failed, or what it waits for."""
    parts: list[str] = []
    for o in c.objects:
        if o.complete:
            continue
        why: list[str] = []
        for n in o.nodes:
            if (o.ref.namespace, n.machine) in cannot_tell:
                why.append(f"{n.machine}: " + CANNOT_TELL.format(
                    why=cannot_tell[(o.ref.namespace, n.machine)]))
            elif n.state is NodeState.CLUSTER_API:
                why.append(f"{n.machine} left to Cluster API ({n.message or 'not in place'})")
            elif n.state is NodeState.FAILED:
                why.append(f"{n.machine} failed" + (f" ({n.message})" if n.message else ""))
        if not why and (w := waiting.get(o.ref)):
            why.append(w)
        if not why and o.target is None:
            why.append("no valid target version")
        if why:
            parts.append(f"{o.ref.kind} {o.ref.name}: {'; '.join(why)}")
    return "; ".join(parts) or "no further step would start (no object says why)"


# -- rendering -----------------------------------------------------------------------------


def _offset(run: DryRun, t: datetime) -> str:
    return "+" + format_duration(timedelta(seconds=int((t - run.start).total_seconds())))


def plan_document(run: DryRun) -> dict[str, Any]:
    """The dry run as JSON (``k0s-fleet plan --output json``)."""
    d = run.decision
    by_key = {c.key: c for c in run.clusters}
    steps_by_owner: dict[ObjectRef, list[PlanStep]] = {}
    for s in run.steps:
        steps_by_owner.setdefault(s.owner, []).append(s)
    waves: list[dict[str, Any]] = []
    for w in d.waves:
        clusters: list[dict[str, Any]] = []
        for key in w.clusters:
            c = by_key[key]
            g = d.clusters[key]
            objects: list[dict[str, Any]] = []
            for o in c.objects:
                steps = steps_by_owner.get(o.ref, [])
                unknown = {n.machine for n in o.nodes
                           if (o.ref.namespace, n.machine) in run.cannot_tell}
                objects.append({
                    "kind": o.ref.kind, "namespace": o.ref.namespace, "name": o.ref.name,
                    "target": o.target, "replicas": o.replicas,
                    "inPlace": [n.machine for n in o.nodes
                                if n.state in (NodeState.WAITING, NodeState.UPGRADING)],
                    "clusterAPI": [{"machine": n.machine, "reason": n.message}
                                   for n in o.nodes if n.state is NodeState.CLUSTER_API
                                   and n.machine not in unknown],
                    # in place or left to Cluster API: the reader cannot tell
                    "cannotTell": [{"machine": n.machine, "reason": CANNOT_TELL.format(
                        why=run.cannot_tell[(o.ref.namespace, n.machine)])}
                        for n in o.nodes if n.machine in unknown],
                    "upToDate": [n.machine for n in o.nodes if n.state is NodeState.UP_TO_DATE],
                    "failed": [n.machine for n in o.nodes if n.state is NodeState.FAILED],
                    "nodeOrder": [n for s in steps for n in s.nodes],
                    "steps": [{"at": format_time(s.at), "offset": _offset(run, s.at),
                               "nodes": list(s.nodes), "unavailable": s.unavailable,
                               "maxUnavailable": s.max_unavailable} for s in steps],
                    "waiting": run.waiting.get(o.ref),
                    "executor": run.executors.get(o.ref, ("", ""))[0] or None,
                    "executorReason": run.executors.get(o.ref, ("", ""))[1] or None,
                })
            t = run.intents.get(key)
            clusters.append({"namespace": key[0], "name": key[1], "phase": g.phase.value,
                             "allowedNow": g.allowed, "reason": g.reason or None,
                             "blocked": run.blocked.get(key), "objects": objects,
                             "ladder": ([t.step, *t.ladder] if t is not None
                                        and t.refusal is None and t.rung is not None
                                        else None),
                             "refusedBy": t.refusal[0] if t is not None
                             and t.refusal is not None else None})
        # A wave that never started (nothing in it to upgrade) is complete, though the
        # gate counts its soak from when it first saw it so (the next wave waits it out).
        phase = WavePhase.COMPLETE if w.phase is WavePhase.SOAKING \
            and w.started_at is None else w.phase
        waves.append({"name": w.name, "canary": w.canary, "phase": phase.value,
                      "maxConcurrentClusters": w.max_concurrent,
                      "soak": format_duration(w.soak),
                      "toleratedFailures": w.tolerated_failures, "clusters": clusters})
    return {
        "generatedAt": format_time(run.start),
        "rollout": {"paused": d.paused, "halted": d.halted, "emergencyStop": d.emergency_stop},
        "waves": waves,
        "steps": [{"at": format_time(s.at), "offset": _offset(run, s.at), "wave": s.wave,
                   "cluster": f"{s.cluster[0]}/{s.cluster[1]}", "kind": s.owner.kind,
                   "object": s.owner.name, "nodes": list(s.nodes),
                   "unavailable": s.unavailable, "maxUnavailable": s.max_unavailable}
                  for s in run.steps],
        "estimatedDuration": None if run.duration is None else format_duration(
            timedelta(seconds=int(run.duration.total_seconds()))),
        "finishesAt": None if run.end is None else format_time(
            run.end.replace(microsecond=0) + timedelta(seconds=run.end.microsecond > 0)),
        "blocked": [{"cluster": f"{k[0]}/{k[1]}", "reason": r}
                    for k, r in sorted(run.blocked.items())],
    }


def plan_text(doc: dict[str, Any], *, wide: Mapping[str, str] | None = None) -> list[str]:
    """A readable rendering of :func:`plan_document`; ``wide`` (``-o wide``) adds a line
    under each cluster (by ``namespace/name``)."""
    out: list[str] = []
    r = doc["rollout"]
    for k in ("emergencyStop", "halted", "paused"):
        if r[k]:
            out.append(f"!! {k}: {r[k]}")
    # A refused cluster is listed once, with its rule and message, under the refusals
    # (the CLI prints them after the plan: fleet/cli/plan.py refusals_text).
    refused = {r["cluster"] for r in doc.get("refusals") or () if not r.get("object")}
    for w in doc["waves"]:
        if w["name"] == DEFAULT_WAVE_NAME and not w["clusters"]:
            continue  # the implicit wave of clusters no other wave selects: here none
        canary = " canary=true" if w["canary"] else ""
        out.append(f"wave {w['name']} [{w['phase']}]{canary} maxConcurrentClusters="
                   f"{w['maxConcurrentClusters']} soak={w['soak']} "
                   f"failureBudget={w['toleratedFailures']}")
        for c in w["clusters"]:
            key = f"{c['namespace']}/{c['name']}"
            blocked = c["blocked"]
            if blocked and key in refused:
                blocked = f"refused by k0s's version skew policy ({c['refusedBy']}, below)"
            out.append(f"  cluster {key} [{c['phase']}]"
                       + (f" blocked: {blocked}" if blocked else ""))
            if wide and (extra := wide.get(f"{c['namespace']}/{c['name']}")):
                out.append(f"    {extra}")
            if c.get("ladder"):
                out.append(f"    ladder (one minor at a time): {' -> '.join(c['ladder'])}")
            for o in c["objects"]:
                out.append(f"    {o['kind']} {o['name']} -> {o['target']}: "
                           f"{len(o['upToDate'])}/{o['replicas']} up to date, "
                           f"{len(o['inPlace'])} in place, {len(o['clusterAPI'])} left to "
                           "Cluster API"
                           + (f", {len(o['cannotTell'])} cannot tell"
                              if o.get("cannotTell") else "")
                           + (f"; executor {o['executor']}" if o.get("executor") else ""))
                if o.get("executorReason"):
                    out.append(f"      ({o['executorReason']})")
                for s in o["steps"]:
                    out.append(f"      {s['offset']:>8}  start {', '.join(s['nodes'])}  "
                               f"(unavailable {s['unavailable']}/{s['maxUnavailable']})")
                for m in o["clusterAPI"]:
                    out.append(f"      Cluster API replaces {m['machine']}: {m['reason']}")
                for m in o.get("cannotTell") or ():
                    out.append(f"      {m['machine']}: {m['reason']}")
                if o["waiting"] and not o["steps"]:
                    out.append(f"      waiting: {o['waiting']}")
    if doc["estimatedDuration"] is not None:
        out.append(f"estimated duration: {doc['estimatedDuration']} "
                   f"(finishes {doc['finishesAt']})")
    else:
        others = [b for b in doc["blocked"] if b["cluster"] not in refused]
        n = len(refused & {b["cluster"] for b in doc["blocked"]})
        out.append("the rollout cannot finish from here"
                   + (f" (k0s's version skew policy refuses {n} cluster(s), below)"
                      if n else "") + (":" if others else ""))
        out.extend(f"  {b['cluster']}: {b['reason'] or 'no reason recorded'}"
                   for b in others)
    return out


def render_plan(doc: dict[str, Any], *, wide: Mapping[str, str] | None = None) -> str:
    return "\n".join(plan_text(doc, wide=wide))


__all__ = ["DryRun", "PlanStep", "dry_run", "plan_document", "plan_text", "render_plan"]
