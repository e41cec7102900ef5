"""The upgrade intent: FleetUpgrade objects, which cluster goes to which version. Pure.

A ``FleetUpgrade`` (fleet.k0s-fleet.io/v1alpha1, in the controller's namespace) says
"this fleet, or the clusters matching this selector, go to k0s version X". Where several
select one cluster, the newest (creation time, then name) wins. The controller turns the
intent into each MachineDeployment's and K0sControlPlane's *target*; it writes the
version into the object itself when the rollout policy admits the cluster (the planner's
version step, fleet/planner/writer.py). A cluster no FleetUpgrade covers keeps the
version k0s-fleet last wrote or adopted into its objects: a version edited into them by
hand is never a target (the writer reports it). This module also computes the
FleetUpgrade's status (per wave and per cluster) from the gate's decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from fleet.contract.selectors import LabelSelector
from fleet.contract.skew import EMPTY_CATALOG, RULE_NO_DOWNGRADE, ReleaseCatalog, SkewRefusal, climb
from fleet.contract.versions import (
    InvalidVersionError,
    K0sVersion,
    normalize,
    same_version,
    valid_version,
)
from fleet.world.model import (
    FLEET_UPGRADE_FINALIZER,
    ClusterInfo,
    ClusterKey,
    Condition,
    ControlPlaneInfo,
    FleetUpgradeInfo,
    IntentTarget,
    MachineDeploymentInfo,
    ObjectRef,
    Snapshot,
    parse_conditions,
    parse_time,
    truncate,
)

KIND_FLEET_UPGRADE = "FleetUpgrade"

# Conditions on a FleetUpgrade (usable with `kubectl wait --for=condition=...`).
COND_COMPLETE = "Complete"
COND_PROGRESSING = "Progressing"
COND_FAILED = "Failed"
# True while k0s's version skew policy (fleet/contract/skew.py) keeps some selected cluster where it
# is (a downgrade, a minor skipped with no rung to climb by); its reason names the rule.
COND_REFUSED = "Refused"
REASON_REFUSED = "VersionSkewRefused"

PHASE_PENDING = "Pending"
PHASE_PROGRESSING = "Progressing"
PHASE_COMPLETE = "Complete"
PHASE_FAILED = "Failed"
PHASE_REFUSED = "Refused"  # a cluster's phase: the skew rules keep it where it is
PHASE_WITHDRAWING = "Withdrawing"  # deleted: its started clusters finish, no new ones
REASON_WITHDRAWING = "Withdrawing"

_Owner = TypeVar("_Owner", MachineDeploymentInfo, ControlPlaneInfo)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_CLUSTERS_IN_STATUS = 200


def fleet_upgrade_from(obj: Mapping[str, Any]) -> FleetUpgradeInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ref = ObjectRef(KIND_FLEET_UPGRADE, meta.get("namespace") or "", meta.get("name") or "",
                    meta.get("uid") or "")
    raw = spec.get("version")
    problems: list[str] = []
    version: str | None = None
    try:
        version = normalize(raw) if isinstance(raw, str) else None
        if version is None:
            problems.append("spec.version is missing")
    except InvalidVersionError as e:
        problems.append(f"spec.version: {e}")
    selector: LabelSelector | None = None
    raw_selector = spec.get("clusterSelector")
    if raw_selector is not None:
        try:
            selector = LabelSelector.model_validate(raw_selector)
        except ValidationError as e:
            detail = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
                               for err in e.errors())
            problems.append(f"spec.clusterSelector: {detail}")
    return FleetUpgradeInfo(
        ref=ref, version=version, raw_version=str(raw or ""), selector=selector,
        created=parse_time(meta.get("creationTimestamp")) or _EPOCH,
        generation=int(meta.get("generation") or 0),
        problem="; ".join(problems) or None, deleting=bool(meta.get("deletionTimestamp")),
        status=dict(obj.get("status") or {}),
        resource_version=str(meta.get("resourceVersion") or ""),
        finalizers=tuple(str(f) for f in meta.get("finalizers") or ()))


def _matches(u: FleetUpgradeInfo, cluster: ClusterInfo) -> bool:
    return u.selector is None or u.selector.matches(cluster.labels)


def resolve(upgrades: Iterable[FleetUpgradeInfo], clusters: Mapping[ClusterKey, ClusterInfo]
            ) -> dict[ClusterKey, IntentTarget]:
    """Which FleetUpgrade decides each cluster's version: the newest usable one selecting
    it. Clusters no FleetUpgrade selects are absent (their objects' own versions stand)."""
    usable = sorted((u for u in upgrades if u.problem is None and not u.deleting
                     and u.version is not None),
                    key=lambda u: (u.created, u.ref.name), reverse=True)
    out: dict[ClusterKey, IntentTarget] = {}
    for key in sorted(clusters):
        for u in usable:
            if _matches(u, clusters[key]):
                assert u.version is not None
                out[key] = IntentTarget(ObjectRef(u.ref.kind, u.ref.namespace, u.ref.name),
                                        u.version)
                break
    return out


def target_of(obj: MachineDeploymentInfo | ControlPlaneInfo,
              intent: IntentTarget | None) -> str | None:
    """The version the controller works towards for one MD/KCP of a fleet cluster: its
    FleetUpgrade's, else the version k0s-fleet last wrote or adopted (a version someone
    else wrote since is not a target: the writer reports it, fleet/planner/writer.py),
    else, before its first sight, what the object says."""
    if intent is not None:
        return intent.step
    return obj.written_version or obj.object_version


def cluster_versions(snapshot: Snapshot) -> dict[ClusterKey, list[str]]:
    """Per cluster, every version it runs or k0s-fleet has recorded for it: its Machines'
    (not those being deleted) and its MachineDeployments' and K0sControlPlanes' (what
    k0s-fleet wrote, else, before its first sight, what the object says). The oldest of
    them is where a ladder starts."""
    out: dict[ClusterKey, list[str]] = {}
    for m in snapshot.machines.values():
        if not m.deleting and m.version:
            out.setdefault((m.ref.namespace, m.cluster), []).append(m.version)
    owners: list[MachineDeploymentInfo | ControlPlaneInfo] = [
        *snapshot.deployments.values(), *snapshot.control_planes.values()]
    for o in owners:
        # k0s-fleet's record, not a version someone else edited in (the writer reports that)
        v = o.written_version or o.object_version
        if v:
            out.setdefault((o.ref.namespace, o.cluster), []).append(v)
        if isinstance(o, ControlPlaneInfo) and o.hosted and o.status_version:
            out.setdefault((o.ref.namespace, o.cluster), []).append(o.status_version)
    return out


def _written_versions(snapshot: Snapshot) -> dict[ClusterKey, list[str]]:
    """Per cluster, the versions k0s-fleet has written into its objects."""
    out: dict[ClusterKey, list[str]] = {}
    owners: list[MachineDeploymentInfo | ControlPlaneInfo] = [
        *snapshot.deployments.values(), *snapshot.control_planes.values()]
    for o in owners:
        if o.written_version:
            out.setdefault((o.ref.namespace, o.cluster), []).append(o.written_version)
    return out


def with_ladders(intents: Mapping[ClusterKey, IntentTarget],
                 versions: Mapping[ClusterKey, Sequence[str]],
                 catalog: ReleaseCatalog = EMPTY_CATALOG) -> dict[ClusterKey, IntentTarget]:
    """Each intent with the rung its cluster works towards now: the first of the ladder
    from the oldest version the cluster has to the FleetUpgrade's (k0s upgrades one minor
    at a time), or the refusal that keeps the cluster where it is (a downgrade, a missing
    rung, a rung with no digest)."""
    out: dict[ClusterKey, IntentTarget] = {}
    for key, t in intents.items():
        have = [v for v in (valid_version(x) for x in versions.get(key, ())) if v]
        oldest = min(have, key=K0sVersion.parse) if have else None
        if oldest is not None and any(K0sVersion.parse(v) > K0sVersion.parse(t.version)
                                      for v in have):
            newest = max(have, key=K0sVersion.parse)
            out[key] = dataclasses.replace(t, refusal=(RULE_NO_DOWNGRADE, (
                f"the cluster runs {newest}, newer than {t.version}; k0s is never "
                "downgraded")))
            continue
        rungs = climb(oldest, t.version, catalog)
        if isinstance(rungs, SkewRefusal):
            out[key] = dataclasses.replace(t, refusal=(rungs.rule, rungs.message))
        elif len(rungs) > 1:
            out[key] = dataclasses.replace(t, rung=str(rungs[0]),
                                           ladder=tuple(str(r) for r in rungs[1:]))
        else:
            out[key] = t
    return out


def apply_intents(snapshot: Snapshot, upgrades: Iterable[FleetUpgradeInfo],
                  catalog: ReleaseCatalog = EMPTY_CATALOG) -> Snapshot:
    """The snapshot with every object's target set (:func:`target_of`): its cluster's
    intent (the rung of its ladder it is on, :func:`with_ladders`), else k0s-fleet's record
    of what it wrote (``spec_version`` keeps what the object itself says). A cluster whose
    intent k0s's skew rules refuse keeps its record as its target (nothing moves)."""
    ups = {(u.ref.namespace, u.ref.name): u for u in upgrades}
    intents = resolve(ups.values(), snapshot.clusters)
    versions: dict[ClusterKey, list[str]] | None = None
    if intents:
        versions = cluster_versions(snapshot)
        intents = with_ladders(intents, versions, catalog)
    # A deleted FleetUpgrade still held by k0s-fleet's finalizer keeps the clusters whose
    # objects already carry the version it had k0s-fleet write (they finish it); it starts
    # no other cluster (rollout/intents.py shows it Withdrawing, then releases it).
    withdrawing = [dataclasses.replace(u, deleting=False) for u in ups.values()
                   if u.deleting and FLEET_UPGRADE_FINALIZER in u.finalizers]
    if withdrawing:
        versions = versions if versions is not None else cluster_versions(snapshot)
        written = _written_versions(snapshot)
        held = with_ladders(resolve(withdrawing, snapshot.clusters), versions, catalog)
        intents = {**{k: t for k, t in held.items() if t.refusal is None and any(
            same_version(v, t.step) for v in written.get(k, ()))}, **intents}

    def targeted(obj: _Owner) -> _Owner:
        t = intents.get((obj.ref.namespace, obj.cluster))
        target = (obj.written_version or obj.object_version) if t is not None \
            and t.refusal is not None else target_of(obj, t)
        if t is None and target == obj.version:
            return obj
        return dataclasses.replace(obj, version=target, intent=t.intent if t else None,
                                   spec_version=obj.object_version)

    return dataclasses.replace(
        snapshot, deployments={k: targeted(o) for k, o in snapshot.deployments.items()},
        control_planes={k: targeted(o) for k, o in snapshot.control_planes.items()},
        intents=intents, upgrades=ups)


# -- status -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterStanding:
    """Where one cluster stands, as the FleetUpgrade's status shows it."""

    key: ClusterKey
    wave: str
    phase: str  # the gate's cluster phase (Complete, Upgrading, Queued, Failed, Waiting)
    nodes_done: int
    nodes_total: int
    message: str = ""
    complete: bool = False
    failed: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class WaveStanding:
    name: str
    phase: str
    message: str = ""


def upgrade_status(u: FleetUpgradeInfo, intents: Mapping[ClusterKey, IntentTarget],
                   standings: Sequence[ClusterStanding], waves: Sequence[WaveStanding], *,
                   fleet_hold: str | None = None) -> dict[str, Any]:
    """The ``status`` of one FleetUpgrade (without lastTransitionTime, which the writer
    keeps stable). ``standings`` are every fleet cluster's; only those this FleetUpgrade
    decides are shown. ``fleet_hold`` is a fleet-wide stop (halt, pause, emergency stop)."""
    ref = (u.ref.namespace, u.ref.name)
    if u.problem is not None:
        msg = truncate(f"not used: {u.problem}")
        return {"observedGeneration": u.generation, "phase": PHASE_FAILED, "summary": "0/0",
                "message": msg, "clustersTotal": 0, "clustersComplete": 0, "nodesTotal": 0,
                "nodesUpToDate": 0, "waves": [], "clusters": [], "conditions": [
                    _cond(COND_COMPLETE, False, "Invalid", msg),
                    _cond(COND_PROGRESSING, False, "Invalid", msg),
                    _cond(COND_FAILED, True, "Invalid", msg)]}
    mine = [_refused(s, t) if t.refusal is not None else _climbing(s, t) for s in standings
            if (t := intents.get(s.key)) is not None and (t.intent.namespace, t.intent.name) == ref]
    refused = [s for s in mine if intents[s.key].refusal is not None]
    total, done = len(mine), sum(1 for s in mine if s.complete)
    failed = [s for s in mine if s.failed]
    nodes_total = sum(s.nodes_total for s in mine)
    nodes_done = sum(s.nodes_done for s in mine)
    names = {s.wave for s in mine}
    wave_list = []
    for w in waves:
        if w.name not in names:
            continue
        ws = [s for s in mine if s.wave == w.name]
        wave_list.append({
            "name": w.name, "phase": w.phase, "clusters": len(ws),
            "complete": sum(1 for s in ws if s.complete),
            "upgrading": sum(1 for s in ws if s.phase == "Upgrading"),
            "failed": sum(1 for s in ws if s.failed), "message": truncate(w.message)})
    cluster_list = [_cluster_entry(s, intents[s.key])
                    for s in sorted(mine, key=lambda s: s.key)[:_MAX_CLUSTERS_IN_STATUS]]
    summary = f"{done}/{total}"
    if total == 0:
        phase, message = PHASE_PENDING, "no cluster of the fleet is selected by this upgrade"
        conds = [_cond(COND_COMPLETE, False, "NoClusters", message),
                 _cond(COND_PROGRESSING, False, "NoClusters", message),
                 _cond(COND_FAILED, False, "NoClusters", "")]
    elif done == total:
        phase, message = PHASE_COMPLETE, f"{total} cluster(s) on {u.version}"
        conds = [_cond(COND_COMPLETE, True, "AllClustersUpToDate", message),
                 _cond(COND_PROGRESSING, False, "AllClustersUpToDate", ""),
                 _cond(COND_FAILED, False, "AllClustersUpToDate", "")]
    elif refused:
        rules = sorted({r[0] for s in refused if (r := intents[s.key].refusal) is not None})
        listed = "; ".join(f"{s.key[0]}/{s.key[1]}: {s.message}" for s in refused[:3])
        phase = PHASE_FAILED
        message = truncate(f"k0s's version skew policy refuses {len(refused)} cluster(s) "
                           f"({', '.join(rules)}): {listed}; nothing was written to them")
        conds = [_cond(COND_COMPLETE, False, REASON_REFUSED, message),
                 _cond(COND_PROGRESSING, done + len(refused) < total, REASON_REFUSED, message),
                 _cond(COND_FAILED, True, REASON_REFUSED, message),
                 _cond(COND_REFUSED, True, rules[0], message)]
    elif failed:
        listed = ", ".join(f"{s.key[0]}/{s.key[1]}" for s in failed[:5])
        phase = PHASE_FAILED
        message = truncate(f"{len(failed)} cluster(s) with failed node upgrades ({listed}); "
                            "retry (annotation fleet.k0s-fleet.io/retry) or clear them"
                            + (f"; {fleet_hold}" if fleet_hold else ""))
        conds = [_cond(COND_COMPLETE, False, "ClustersFailed", message),
                 _cond(COND_PROGRESSING, False, "ClustersFailed", message),
                 _cond(COND_FAILED, True, "ClustersFailed", message)]
    else:
        phase = PHASE_PROGRESSING
        message = truncate(f"{done}/{total} clusters on {u.version}, "
                            f"{nodes_done}/{nodes_total} nodes"
                            + (f"; {fleet_hold}" if fleet_hold else ""))
        held = fleet_hold is not None
        conds = [_cond(COND_COMPLETE, False, "Upgrading", message),
                 _cond(COND_PROGRESSING, not held, "Held" if held else "Upgrading", message),
                 _cond(COND_FAILED, False, "Upgrading", "")]
    return {"observedGeneration": u.generation, "phase": phase, "summary": summary,
            "message": message, "clustersTotal": total, "clustersComplete": done,
            "nodesTotal": nodes_total, "nodesUpToDate": nodes_done, "waves": wave_list,
            "clusters": cluster_list, "conditions": conds}


def _climbing(s: ClusterStanding, t: IntentTarget) -> ClusterStanding:
    """A cluster on a lower rung of its ladder is not complete, whatever its rung says."""
    if not s.complete or t.rung is None:
        return s
    return dataclasses.replace(s, phase=PHASE_PROGRESSING, complete=False,
                               message=f"on {t.rung}; next {', '.join(t.ladder)}")


def withdrawing_status(u: FleetUpgradeInfo, finishing: Sequence[ClusterStanding]
                       ) -> dict[str, Any]:
    """The status of a deleted FleetUpgrade (held by its finalizer): it admits no cluster
    any more; ``finishing`` are the clusters it had listed that still move towards the
    version k0s-fleet had already written into them (they finish it; nothing is taken
    back). Once none is left the finalizer goes and the object with it."""
    names = ", ".join(f"{s.key[0]}/{s.key[1]}" for s in finishing[:5])
    message = truncate(
        f"withdrawn: no new cluster is admitted; {len(finishing)} cluster(s) finish the "
        f"version already written into them ({names})" if finishing else
        "withdrawn: every cluster it had started has finished")
    failed = [s for s in finishing if s.failed]
    return {"observedGeneration": u.generation, "phase": PHASE_WITHDRAWING,
            "summary": f"{sum(1 for s in finishing if s.complete)}/{len(finishing)}",
            "message": message, "clustersTotal": len(finishing),
            "clustersComplete": sum(1 for s in finishing if s.complete),
            "nodesTotal": sum(s.nodes_total for s in finishing),
            "nodesUpToDate": sum(s.nodes_done for s in finishing), "waves": [],
            "clusters": [{"namespace": s.key[0], "name": s.key[1], "wave": s.wave,
                          "phase": s.phase, "nodes": f"{s.nodes_done}/{s.nodes_total}",
                          "message": truncate(s.message)}
                         for s in sorted(finishing, key=lambda s: s.key)
                         [:_MAX_CLUSTERS_IN_STATUS]],
            "conditions": [_cond(COND_COMPLETE, False, REASON_WITHDRAWING, message),
                           _cond(COND_PROGRESSING, bool(finishing), REASON_WITHDRAWING,
                                 message),
                           _cond(COND_FAILED, bool(failed), REASON_WITHDRAWING,
                                 message if failed else "")]}


def _refused(s: ClusterStanding, t: IntentTarget) -> ClusterStanding:
    assert t.refusal is not None
    rule, why = t.refusal
    return dataclasses.replace(s, phase=PHASE_REFUSED, message=f"{rule}: {why}",
                               complete=False, failed=True)


def _cluster_entry(s: ClusterStanding, t: IntentTarget) -> dict[str, Any]:
    entry: dict[str, Any] = {"namespace": s.key[0], "name": s.key[1], "wave": s.wave,
                             "phase": s.phase, "nodes": f"{s.nodes_done}/{s.nodes_total}",
                             "message": truncate(s.message)}
    if t.rung is not None:
        entry["rung"] = t.rung
        entry["ladder"] = list(t.ladder)
    if t.refusal is not None:
        entry["refusedBy"] = t.refusal[0]
    return entry


def _cond(ctype: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": ctype, "status": "True" if status else "False", "reason": reason,
            "message": message}


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``new`` says anything ``old`` does not (lastTransitionTime aside)."""
    def strip(s: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(s)
        out["conditions"] = [
            (c.type, c.status, c.reason, c.message)
            for c in parse_conditions(s.get("conditions"))]
        return out
    return strip(old) != strip(new)


def conditions_of(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    return parse_conditions(status.get("conditions"))


__all__ = [
    "COND_COMPLETE",
    "COND_FAILED",
    "COND_PROGRESSING",
    "COND_REFUSED",
    "KIND_FLEET_UPGRADE",
    "ClusterStanding",
    "WaveStanding",
    "apply_intents",
    "cluster_versions",
    "fleet_upgrade_from",
    "resolve",
    "status_changed",
    "target_of",
    "upgrade_status",
    "with_ladders",
    "withdrawing_status",
]
