"""How far each cluster of the fleet is, judged on fresh observations.

The wave gate never trusts status it wrote itself: a node counts as done only when the
workload cluster's Node (as observed now) is Ready, schedulable and reports the target
k0s version. NodePlans tell what has *started* (durably: they live in the API) and what
is in flight or failed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.versions import same_version, valid_version
from fleet.planner.conditions import HALTED, UP_TO_DATE
from fleet.rollout.annotations import ANN_PAUSED, switch
from fleet.world.delta import Delta, DeltaList, generation, moved_since
from fleet.world.eligibility import (
    Eligibility,
    as_recorded,
    control_plane_eligibility,
    machine_deployment_eligibility,
)
from fleet.world.executors import executor
from fleet.world.model import (
    ClusterKey,
    ControlPlaneInfo,
    FleetUpgradeInfo,
    IntentTarget,
    MachineDeploymentInfo,
    MachineInfo,
    NodeInfo,
    NodePlanInfo,
    ObjectRef,
    Snapshot,
)
from fleet.world.reported import running_version


class NodeState(StrEnum):
    """Where one node stands relative to its object's target version."""

    UP_TO_DATE = "UpToDate"  # Ready, schedulable, reports the target version
    UPGRADING = "Upgrading"  # a NodePlan for the target is pending or in progress
    FAILED = "Failed"  # the NodePlan for the target failed (not yet retried/cleared)
    WAITING = "Waiting"  # out of date, upgradable in place, nothing started yet
    CLUSTER_API = "ClusterAPI"  # out of date in more than the version: CAPI replaces it
    NOT_READY = "NotReady"  # not out of date by its Machine, but not Ready / cordoned
    MISSING = "Missing"  # no Node observed for the Machine (or cluster unreachable)


@dataclass(frozen=True, slots=True)
class NodeProgress:
    machine: str
    node: str
    state: NodeState
    version: str | None = None  # what the node reports running
    phase: str = ""  # the NodePlan's node state (Downloading, ...) while upgrading
    message: str = ""


@dataclass(frozen=True, slots=True)
class ObjectProgress:
    """One MachineDeployment or K0sControlPlane."""

    ref: ObjectRef
    target: str | None  # normalised target version; None when missing or invalid
    replicas: int
    nodes: tuple[NodeProgress, ...] = ()
    started: bool = False  # a NodePlan for the target exists (durable)
    halted: bool = False  # the planner's K0sFleetHalted condition (per-object budget)
    paused: str | None = None  # reason of the object-level pause annotation

    def count(self, state: NodeState) -> int:
        return sum(1 for n in self.nodes if n.state is state)

    @property
    def done(self) -> int:
        return self.count(NodeState.UP_TO_DATE)

    @property
    def in_flight(self) -> int:
        return self.count(NodeState.UPGRADING)

    @property
    def failed(self) -> int:
        return self.count(NodeState.FAILED)

    @property
    def waiting(self) -> int:
        """Nodes k0s-fleet could start upgrading in place now."""
        return self.count(NodeState.WAITING)

    @property
    def complete(self) -> bool:
        return (
            self.target is not None
            and len(self.nodes) >= self.replicas
            and all(n.state is NodeState.UP_TO_DATE for n in self.nodes)
        )


@dataclass(frozen=True, slots=True)
class ClusterProgress:
    """One CAPI Cluster: its labels/annotations and the progress of its objects."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    objects: tuple[ObjectProgress, ...] = ()
    observed: bool = True  # its Nodes are known right now (False: unreachable / stale)
    spec_paused: bool = False  # Cluster.spec.paused (Cluster API's own pause)
    unreachable_since: datetime | None = None  # its API server stopped answering then
    unreachable_error: str = ""
    # Another controller replica acts on it (sharding): its nodes are judged from the
    # management objects (NodePlans, the versions recorded on Machines), not watched here.
    foreign: bool = False
    # The FleetUpgrade's version while the cluster is on a lower rung of its ladder
    # (fleet/contract/skew.py: one minor at a time): not complete until it is there, and its
    # targets (the rollout's identity) are that version, not the rung's.
    climbing: str | None = None
    # (namespace, name), made once: the wave gate asks for it many times per cluster and
    # pass, over the whole fleet.
    key: ClusterKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.namespace, self.name))

    @property
    def not_observed_reason(self) -> str:
        """Why its Nodes are not known right now (for holds and the status view)."""
        if self.unreachable_since is not None:
            since = self.unreachable_since.strftime("%Y-%m-%dT%H:%M:%SZ")
            return f"workload cluster unreachable since {since}" + (
                f": {self.unreachable_error}" if self.unreachable_error else "")
        return "workload cluster not observed (not synced yet, or no usable kubeconfig)"

    @property
    def started(self) -> bool:
        return any(o.started for o in self.objects)

    @property
    def complete(self) -> bool:
        return self.observed and self.climbing is None and all(o.complete for o in self.objects)

    @property
    def failed(self) -> int:
        """Failed node upgrades (for the current targets) not yet retried or cleared."""
        return sum(o.failed for o in self.objects) + sum(
            1 for o in self.objects if o.halted and o.failed == 0
        )

    @property
    def in_flight(self) -> int:
        return sum(o.in_flight for o in self.objects)

    @property
    def needs_dispatch(self) -> bool:
        """Some node could be upgraded in place and has not been started."""
        return any(o.waiting and o.target is not None for o in self.objects)

    @property
    def nodes_total(self) -> int:
        return sum(max(o.replicas, len(o.nodes)) for o in self.objects)

    @property
    def nodes_done(self) -> int:
        return sum(o.done for o in self.objects)

    @property
    def paused(self) -> str | None:
        return switch(self.annotations, ANN_PAUSED)

    def targets(self) -> list[tuple[str, str, str]]:
        return sorted((o.ref.kind, o.ref.name, self.climbing or o.target or "")
                      for o in self.objects)


def fingerprint(clusters: Iterable[ClusterProgress]) -> str:
    """Identity of "these clusters with these targets": a new target, or a cluster joining
    or leaving, is a new rollout of the wave."""
    return fingerprint_of((c.namespace, c.name, tuple(c.targets())) for c in clusters)


def fingerprint_of(bodies: Iterable[tuple[str, str, tuple[tuple[str, str, str], ...]]]
                   ) -> str:
    """:func:`fingerprint` from each cluster's ``(namespace, name, targets)`` at hand (the
    rollout gate keeps them per cluster: a wave of 1000 asked each for its targets again
    whenever one member's moved)."""
    return hashlib.sha256(json.dumps(sorted(bodies)).encode()).hexdigest()[:16]


# -- from the controller's snapshot -----------------------------------------------------



def _still_live(plan: NodePlanInfo, node: NodeInfo) -> bool:
    """The node carries ``plan``'s request and has not ended it."""
    carried = executor(plan.executor).carried(node)
    return carried is not None and carried.plan_id == plan.plan_id and not carried.terminal


def _node_progress(m: MachineInfo, target: str | None, nodes: Mapping[str, NodeInfo] | None,
                   plan: NodePlanInfo | None, eligibility: Eligibility | None,
                   *, foreign: bool = False) -> NodeProgress:
    node = None if nodes is None else nodes.get(m.node_name)
    version = running_version(m, node)
    on_target = target is not None and same_version(version, target)
    if plan is not None and plan.phase in (NodePlanPhase.PENDING, NodePlanPhase.IN_PROGRESS):
        return NodeProgress(m.ref.name, m.node_name, NodeState.UPGRADING, version,
                            plan.node_state or plan.phase, plan.message)
    if plan is not None and plan.phase == NodePlanPhase.FAILED:
        if node is not None and _still_live(plan, node):
            # Failed by a deadline while the node still works on the request: the node is
            # mid-upgrade, so its cluster keeps its slot (no further cluster is admitted
            # in its place) until the request ends on the node.
            return NodeProgress(m.ref.name, m.node_name, NodeState.UPGRADING, version,
                                plan.node_state or plan.phase,
                                f"NodePlan failed ({plan.message}); the node has not "
                                "finished the request yet")
        return NodeProgress(m.ref.name, m.node_name, NodeState.FAILED, version,
                            plan.node_state, plan.message)
    if node is None and not foreign:
        why = "cluster not observed" if nodes is None else "no Node for this Machine"
        return NodeProgress(m.ref.name, m.node_name, NodeState.MISSING, version, message=why)
    # A foreign cluster's node: its replica records a node's upgrade on the Machine only
    # once the node is Ready, schedulable and reports the version; trust that record.
    healthy = node is None or (node.ready and not node.unschedulable)
    if on_target and healthy:
        if plan is None and eligibility is not None and not eligibility.up_to_date \
                and eligibility.in_place:
            # It runs the target, but the planner still has its upgrade to do (its
            # NodePlan was deleted before the completion was recorded on the Machine):
            # not done, or the gate would hold a cluster the planner must still finish.
            # (With its Completed NodePlan there, the record is on its way: done.)
            return NodeProgress(m.ref.name, m.node_name, NodeState.WAITING, version,
                                message=f"reports {version}; not recorded on its Machine")
        return NodeProgress(m.ref.name, m.node_name, NodeState.UP_TO_DATE, version)
    health = "" if node is None else (
        "NotReady" if not node.ready else ("cordoned" if node.unschedulable else ""))
    if on_target or eligibility is None or eligibility.up_to_date:
        return NodeProgress(m.ref.name, m.node_name, NodeState.NOT_READY, version,
                            message=health or f"reports {version}")
    if eligibility.in_place:
        return NodeProgress(m.ref.name, m.node_name, NodeState.WAITING, version, message=health)
    return NodeProgress(m.ref.name, m.node_name, NodeState.CLUSTER_API, version,
                        message=eligibility.reason)


_HOLDER_REPORTS = "up to date, as the replica holding its cluster reports"
# What the management objects alone cannot tell apart from "up to date" (no NodePlan of
# the target says otherwise): the holder's count may settle it.
_UNDECIDED = (NodeState.WAITING, NodeState.NOT_READY, NodeState.MISSING)


def _as_its_holder_reports(obj: MachineDeploymentInfo | ControlPlaneInfo, target: str | None,
                           progress: list[NodeProgress]) -> list[NodeProgress]:
    """Another replica's object (sharding): how many of its nodes are up to date is what
    the replica holding its cluster, which sees the Nodes, last wrote into the object's
    status (``status.k0sFleet.updated`` for this very target), where the management
    objects say less. Without that a node never upgraded by k0s-fleet (a cluster created
    at the target, a scale-up) has no record on its Machine: it would count as not done
    here and as done once this replica holds the cluster, and the FleetUpgrade status
    (and the waves) would change only because the cluster changed hands. A NodePlan of
    the target (upgrading, failed) still decides its node."""
    updated = _holder_updated(obj, target)
    if updated is None:
        return progress
    extra = updated - sum(1 for n in progress if n.state is NodeState.UP_TO_DATE)
    out: list[NodeProgress] = []
    for n in progress:
        if extra > 0 and n.state in _UNDECIDED:
            out.append(NodeProgress(n.machine, n.node, NodeState.UP_TO_DATE, n.version,
                                    message=_HOLDER_REPORTS))
            extra -= 1
        else:
            out.append(n)
    return out


# The K0sFleetUpToDate message the planner writes: "<updated>/<total> machines on <target>"
_SUMMARY = re.compile(r"^(\d+)/(\d+) machines on (\S+)")


def _holder_updated(obj: MachineDeploymentInfo | ControlPlaneInfo, target: str | None
                    ) -> int | None:
    """How many of ``obj``'s machines its writer last recorded up to date on ``target``:
    ``status.k0sFleet`` where the CRD keeps it, else the K0sFleetUpToDate condition's
    summary (Cluster API's CRDs prune unknown status fields). None: nothing for ``target``."""
    if target is None:
        return None
    counts = obj.status.counts
    updated = counts.get("updated")
    if isinstance(updated, int) and not isinstance(updated, bool):
        return updated if same_version(counts.get("targetVersion"), target) else None
    cond = obj.status.condition(UP_TO_DATE)
    m = _SUMMARY.match(cond.message) if cond is not None else None
    if m is None or not same_version(m.group(3), target):
        return None
    return int(m.group(1))


def clusters_from_snapshot(snapshot: Snapshot) -> list[ClusterProgress]:
    """Progress of every cluster in ``snapshot`` (labels and annotations from its CAPI
    Cluster object). Whether a node is upgradable in place is the controller's own rule
    (fleet.world.eligibility).
    """
    plans: dict[tuple[str, str, str], list[NodePlanInfo]] = {}
    for p in snapshot.nodeplans.values():
        if not p.deleting:
            plans.setdefault((p.ref.namespace, p.owner_kind, p.owner_name), []).append(p)
    machines: dict[tuple[str, str, str], list[MachineInfo]] = {}
    for m in snapshot.machines.values():
        if m.owner is not None and not m.deleting:
            machines.setdefault((m.owner.kind, m.owner.namespace, m.owner.name), []).append(m)

    owners: dict[ClusterKey, list[MachineDeploymentInfo | ControlPlaneInfo]] = {}
    for md in snapshot.deployments.values():
        owners.setdefault((md.ref.namespace, md.cluster), []).append(md)
    for kcp in snapshot.control_planes.values():
        owners.setdefault((kcp.ref.namespace, kcp.cluster), []).append(kcp)

    out: list[ClusterProgress] = []
    for key in sorted(set(snapshot.clusters) | set(owners)):
        info = snapshot.clusters.get(key)
        nodes = snapshot.nodes.get(key)
        foreign = key in snapshot.foreign
        objects = [_object_progress(snapshot, o, nodes, machines, plans, foreign=foreign)
                   for o in sorted(owners.get(key, []), key=lambda o: o.ref)]
        out.append(ClusterProgress(
            namespace=key[0], name=key[1],
            labels=dict(info.labels) if info else {},
            annotations=dict(info.annotations) if info else {},
            objects=tuple(objects), observed=nodes is not None or foreign, foreign=foreign,
            spec_paused=bool(info and info.paused),
            unreachable_since=info.unreachable_since if info else None,
            unreachable_error=info.unreachable_error if info else "",
            climbing=_climbing(snapshot, key)))
    return out


def _climbing(snapshot: Snapshot, key: ClusterKey) -> str | None:
    t = snapshot.intents.get(key)
    return t.version if t is not None and t.rung is not None and t.refusal is None else None


_EMPTY: Mapping[Any, Any] = MappingProxyType({})
T = TypeVar("T")
V = TypeVar("V")


class _One(Mapping[T, V]):
    """A read-only mapping of one entry (a digest's ClusterInfo, its intent): a quarter of
    the size of a dict of one, for each of thousands of foreign clusters."""

    __slots__ = ("_key", "_value")

    def __init__(self, key: T, value: V) -> None:
        self._key, self._value = key, value

    def __getitem__(self, key: T) -> V:
        if key == self._key:
            return self._value
        raise KeyError(key)

    def __iter__(self) -> Iterator[T]:
        return iter((self._key,))

    def __len__(self) -> int:
        return 1

    def __repr__(self) -> str:
        return repr({self._key: self._value})


class _OneKey(AbstractSet[T]):
    """A set of one (a digest's ``foreign``): a quarter of a frozenset of one."""

    __slots__ = ("_key",)

    def __init__(self, key: T) -> None:
        self._key = key

    def __contains__(self, key: object) -> bool:
        return key == self._key

    def __iter__(self) -> Iterator[T]:
        return iter((self._key,))

    def __len__(self) -> int:
        return 1

    def __repr__(self) -> str:
        return repr({self._key})


def _s(value: str | None) -> str | None:
    return None if value is None else sys.intern(value)


def _compact(c: ClusterProgress, names: Mapping[str, str]) -> ClusterProgress:
    """``c`` with the strings that repeat across the fleet's thousands of foreign clusters
    interned (kinds, namespaces, versions, phases, messages), a node named as its Machine
    sharing the Machine's name, and its empty mappings shared: equal to ``c``."""
    objects = tuple(ObjectProgress(
        ref=ObjectRef(sys.intern(o.ref.kind), sys.intern(o.ref.namespace), o.ref.name),
        target=_s(o.target), replicas=o.replicas,
        nodes=tuple(NodeProgress(m, m if n.node == m else n.node, n.state, _s(n.version),
                                 sys.intern(n.phase), sys.intern(n.message))
                    for n in o.nodes for m in (names.get(n.machine, n.machine),)),
        started=o.started, halted=o.halted, paused=_s(o.paused)) for o in c.objects)
    return ClusterProgress(
        namespace=sys.intern(c.namespace), name=c.name,
        labels=c.labels or _EMPTY, annotations=c.annotations or _EMPTY, objects=objects,
        observed=c.observed, spec_paused=c.spec_paused,
        unreachable_since=c.unreachable_since, unreachable_error=c.unreachable_error,
        foreign=c.foreign, climbing=_s(c.climbing))


def foreign_digest(part: Snapshot, names: Mapping[str, str] | None = None) -> Snapshot:
    """A foreign cluster's snapshot part as a sharded replica keeps it: its rollout progress
    (what the fleet-wide gate and status read of a cluster another replica acts on),
    computed now, instead of its management objects (Machines, MachineDeployments,
    MachineSets, K0sControlPlanes), which nothing else reads of such a cluster. Its
    ClusterInfo, NodePlans and intent stay (small; the status writer reads the intents).
    ``names``: the strings to name its Machines by (those the caches hold anyway)
    :func:`part_progress` of the digest equals :func:`clusters_from_snapshot` of ``part``."""
    progress = tuple(_compact(c, names or {}) for c in clusters_from_snapshot(part))
    # the labels and annotations the part's ClusterInfo holds anyway, not a copy of them
    progress = tuple(dataclasses.replace(c, labels=info.labels, annotations=info.annotations)
                     if (info := part.clusters.get(c.key)) is not None
                     and info.labels == c.labels and info.annotations == c.annotations
                     else c for c in progress)
    for c in progress:  # the part's key tuple (and name), not one more of each
        for key in part.clusters:
            if key == c.key:
                object.__setattr__(c, "key", key)
                object.__setattr__(c, "name", key[1])
    def small(m: Mapping[T, V]) -> Mapping[T, V]:
        if not m:
            return _EMPTY  # empty: one shared mapping
        if len(m) == 1:
            ((k, v),) = m.items()
            return _One(k, v)
        return m

    if len(_INTENTS) > 4096:
        _INTENTS.clear()
    intents = {k: _INTENTS.setdefault(t, t) for k, t in part.intents.items()}
    upgrades = part.upgrades  # the fleet's, the same in every part: one mapping kept
    if _UPGRADES and _UPGRADES[0] == upgrades:
        upgrades = _UPGRADES[0]
    else:
        _UPGRADES[:] = [upgrades]
    return dataclasses.replace(
        part, upgrades=upgrades, deployments=_EMPTY, machine_sets=_EMPTY, control_planes=_EMPTY,
        machines=_EMPTY, nodes=_EMPTY, nodeplans=small(part.nodeplans),
        clusters=small(part.clusters),
        foreign=_OneKey(next(iter(part.foreign))) if len(part.foreign) == 1 else part.foreign,
        intents=small(intents), autopilot_plans=small(part.autopilot_plans),
        progress=progress)


# One IntentTarget (FleetUpgrade, version) for the many foreign clusters it covers.
_INTENTS: dict[IntentTarget, IntentTarget] = {}
_UPGRADES: list[Mapping[tuple[str, str], FleetUpgradeInfo]] = []  # the last digest's


def part_progress(part: Snapshot) -> list[ClusterProgress]:
    """The progress of one snapshot part: remembered in it (a foreign digest), or computed."""
    if part.progress is not None:
        return [c for c in part.progress if isinstance(c, ClusterProgress)]
    return clusters_from_snapshot(part)


class ProgressMemo:
    """Cluster progress remembered per cluster, keyed by the cluster's snapshot part (the
    same object means nothing it is derived from changed): a pass in which one cluster
    moved recomputes that cluster's progress, not the fleet's, and puts it in place in the
    fleet's list (sorted once, again only when clusters join or leave)."""

    def __init__(self) -> None:
        self._memo: dict[ClusterKey, tuple[Snapshot, list[ClusterProgress]]] = {}
        self._flat: list[ClusterProgress] = []  # every part's progress, by cluster key
        self._at: dict[ClusterKey, int] = {}  # where a part's one progress is in _flat
        self.computed = 0  # clusters whose progress was computed (metrics, tests)
        self._parts_gen = 0  # the generation of the parts last read (fleet.world.delta)
        self._delta: Delta | None = None  # what the last list handed out moved by

    def clusters(self, snapshot: Snapshot) -> list[ClusterProgress]:
        """As :func:`clusters_from_snapshot` (equal result), from the remembered parts.
        The list says which clusters' progress moved since the one this made before
        (a :class:`~fleet.world.delta.DeltaList`); when the snapshot's parts say which
        moved since the parts this last read, only those are looked at."""
        parts = snapshot.parts
        memo = self._memo
        if parts is None:
            memo.clear()
            self._flat, self._at, self._parts_gen = [], {}, 0
            return clusters_from_snapshot(snapshot)
        hinted = moved_since(parts, self._parts_gen)
        self._parts_gen = 0  # (again once this call is through)
        if hinted is None:
            moved = [k for k, p in parts.items()
                     if (hit := memo.get(k)) is None or hit[0] is not p]
            new = sum(1 for k in moved if k not in memo)
            reshape = len(memo) + new != len(parts)  # some left
            gone = [k for k in memo if k not in parts] if reshape else []
        else:
            moved = [k for k in hinted if k in parts
                     and ((hit := memo.get(k)) is None or hit[0] is not parts[k])]
            gone = [k for k in hinted if k not in parts and k in memo]
            reshape = bool(gone) or any(k not in memo for k in moved)
        for key in gone:
            del memo[key]
        for key in moved:
            part = parts[key]
            progress = part_progress(part)
            self.computed += 1
            old = memo.get(key)
            memo[key] = (part, progress)
            at = self._at.get(key)
            if old is None or at is None or len(progress) != 1:
                reshape = True
            elif not reshape:
                self._flat[at] = progress[0]
        if reshape:
            flat: list[ClusterProgress] = []
            at_of: dict[ClusterKey, int] = {}
            for key in sorted(memo):
                progress = memo[key][1]
                if len(progress) == 1:
                    at_of[key] = len(flat)
                flat.extend(progress)
            self._flat, self._at = flat, at_of
        self._parts_gen = generation(parts)
        delta = Delta.after(self._delta, (*moved, *gone)) if moved or gone or \
            self._delta is None else self._delta
        self._delta = delta
        return DeltaList(self._flat, delta, functools.partial(self._lookup, delta))

    def _lookup(self, delta: Delta, key: ClusterKey) -> list[ClusterProgress] | None:
        """The progress of ``key`` in the list of ``delta`` (None: a list made since)."""
        if self._delta is not delta:
            return None
        hit = self._memo.get(key)
        return [] if hit is None else hit[1]


def _object_progress(
    snapshot: Snapshot,
    obj: MachineDeploymentInfo | ControlPlaneInfo,
    nodes: Mapping[str, NodeInfo] | None,
    machines: Mapping[tuple[str, str, str], list[MachineInfo]],
    plans: Mapping[tuple[str, str, str], list[NodePlanInfo]],
    *, foreign: bool = False,
) -> ObjectProgress:
    ref = ObjectRef(obj.ref.kind, obj.ref.namespace, obj.ref.name)
    target = valid_version(obj.version)
    if isinstance(obj, ControlPlaneInfo) and obj.hosted:
        return _hosted_progress(obj, ref, target)
    mine = sorted(machines.get((ref.kind, ref.namespace, ref.name), []),
                  key=MachineInfo.sort_key)
    for_target = [p for p in plans.get((ref.namespace, ref.kind, ref.name), [])
                  if target is not None and same_version(p.version, target)]
    by_machine = {p.machine: p for p in for_target}
    progress: list[NodeProgress] = []
    for machine in mine:
        # A worker's Completed NodePlan is its record until the paused sequence ends.
        m = as_recorded(machine, obj, by_machine.get(machine.ref.name)) \
            if isinstance(obj, MachineDeploymentInfo) else machine
        elig: Eligibility | None = None
        if target is not None:
            if isinstance(obj, MachineDeploymentInfo):
                ms = snapshot.machine_sets.get((m.ref.namespace, m.machine_set or ""))
                elig = machine_deployment_eligibility(
                    m, obj, ms, nodes.get(m.node_name) if nodes is not None else None)
            else:
                elig = control_plane_eligibility(m, obj)
        progress.append(_node_progress(m, target, nodes, by_machine.get(m.ref.name), elig,
                                       foreign=foreign))
    if foreign:
        progress = _as_its_holder_reports(obj, target, progress)
    halted = any(c.type == HALTED and c.status == "True" for c in obj.status.conditions)
    return ObjectProgress(ref=ref, target=target, replicas=obj.replicas, nodes=tuple(progress),
                          started=bool(for_target), halted=halted,
                          paused=switch(obj.annotations, ANN_PAUSED))


def _hosted_progress(obj: ControlPlaneInfo, ref: ObjectRef, target: str | None
                     ) -> ObjectProgress:
    """A hosted control plane's progress, one entry per replica, from what k0smotron
    reports: up to date when it runs the target with every replica ready, upgrading once
    k0s-fleet wrote the target (k0smotron rolls its pods), waiting before that."""
    written = target is not None and same_version(obj.object_version, target) \
        and same_version(obj.written_version, target)
    if obj.hosted_on(target):
        state, message = NodeState.UP_TO_DATE, ""
    elif written:
        state, message = NodeState.UPGRADING, (
            f"k0smotron reports {obj.status_version or 'no version'}, "
            f"{obj.ready_replicas}/{obj.replicas} ready")
    else:
        state, message = NodeState.WAITING, ""
    nodes = tuple(NodeProgress(f"{ref.name}-{i}", "", state, obj.status_version,
                               message=message) for i in range(obj.replicas))
    halted = any(c.type == HALTED and c.status == "True" for c in obj.status.conditions)
    return ObjectProgress(ref=ref, target=target, replicas=obj.replicas, nodes=nodes,
                          started=written, halted=halted,
                          paused=switch(obj.annotations, ANN_PAUSED))


__all__ = [
    "ClusterProgress",
    "NodeProgress",
    "NodeState",
    "ObjectProgress",
    "ProgressMemo",
    "clusters_from_snapshot",
    "fingerprint",
    "foreign_digest",
    "part_progress",
]
