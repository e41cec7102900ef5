"""Planning in proportion to change: each cluster is planned on its own, and again only
when something it depends on moved.

A pass of :func:`fleet.planner.plan` never looks across clusters (every rule is about one
K0sControlPlane, one MachineDeployment or one cluster's nodes); the only fleet-wide input
is the policy's ``hold``. So the fleet's plan is the union of its clusters' plans, and a
cluster's plan is a pure function of

* its own part of the snapshot (:func:`split` cuts one; the controller keeps one per
  cluster and rebuilds only the parts whose objects changed),
* the answers ``hold`` gave for it (recorded while planning it, asked again each pass),
* the time, which matters only from the ``wake_at`` its last plan named.

:class:`IncrementalPlanner` remembers each cluster's plan with those three keys and
re-plans a cluster only when a key moved (or the caller says so). The property test
(tests/unit/test_incremental_planner.py) holds it equal to a full :func:`plan` of the
whole snapshot for random fleets and event sequences.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from fleet.model import ClusterKey, ObjectRef, Snapshot
from fleet.planner.actions import Action, Decision, PlanResult
from fleet.planner.core import plan
from fleet.planner.policy import Hold, VerdictHold
from fleet.planner.settings import PlannerSettings

T = TypeVar("T")
HoldAnswers = dict[tuple[ClusterKey, ObjectRef], object]


class _ClusterObject(Protocol):
    @property
    def ref(self) -> ObjectRef: ...
    @property
    def cluster(self) -> str: ...


Obj = TypeVar("Obj", bound=_ClusterObject)


def _by_cluster(objs: Mapping[tuple[str, str], Obj]
                ) -> dict[ClusterKey, dict[tuple[str, str], Obj]]:
    out: dict[ClusterKey, dict[tuple[str, str], Obj]] = defaultdict(dict)
    for k, o in objs.items():
        out[(o.ref.namespace, o.cluster)][k] = o
    return out


class OtherNodePlans(AbstractSet[tuple[str, str]]):
    """``Snapshot.other_nodeplans`` of one cluster's part: the NodePlans of every other
    cluster (``where``: NodePlan -> its cluster), plus ``beyond`` (those left out of the
    whole snapshot). A view, not a copy (a copy per part would be quadratic in the fleet);
    the controller's stays live. What it holds only matters to a node request naming a
    NodePlan of another cluster (workload clusters sharing an API server), which that
    cluster's own plan acts on."""

    __slots__ = ("_beyond", "_cluster", "_where")

    def __init__(self, where: Mapping[tuple[str, str], ClusterKey], cluster: ClusterKey,
                 beyond: AbstractSet[tuple[str, str]] = frozenset()) -> None:
        self._where, self._cluster, self._beyond = where, cluster, beyond

    def __contains__(self, key: object) -> bool:
        owner = self._where.get(key)  # type: ignore[call-overload]
        return (owner is not None and owner != self._cluster) or key in self._beyond

    def __iter__(self) -> Iterator[tuple[str, str]]:
        mine = [k for k, c in list(self._where.items()) if c != self._cluster]
        return iter(mine + [k for k in self._beyond if k not in self._where])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def split(snapshot: Snapshot) -> dict[ClusterKey, Snapshot]:
    """``snapshot`` cut into one snapshot per cluster: each holds that cluster's objects
    (by the cluster they name) and the fleet's FleetUpgrades. Planning the parts one by one
    gives the actions of planning the whole (per object, in the same order)."""
    deployments = _by_cluster(snapshot.deployments)
    machine_sets = _by_cluster(snapshot.machine_sets)
    control_planes = _by_cluster(snapshot.control_planes)
    machines = _by_cluster(snapshot.machines)
    nodeplans = _by_cluster(snapshot.nodeplans)
    keys = set(snapshot.clusters) | set(snapshot.nodes) | set(deployments) | set(
        machine_sets) | set(control_planes) | set(machines) | set(nodeplans)

    def only(ckey: ClusterKey, m: Mapping[ClusterKey, T]) -> dict[ClusterKey, T]:
        return {ckey: m[ckey]} if ckey in m else {}

    where = {k: (p.ref.namespace, p.cluster) for k, p in snapshot.nodeplans.items()}

    return {ckey: Snapshot(
        now=snapshot.now, clusters=only(ckey, snapshot.clusters),
        deployments=deployments.get(ckey, {}), machine_sets=machine_sets.get(ckey, {}),
        control_planes=control_planes.get(ckey, {}), machines=machines.get(ckey, {}),
        nodeplans=nodeplans.get(ckey, {}), nodes=only(ckey, snapshot.nodes),
        intents=only(ckey, snapshot.intents), upgrades=snapshot.upgrades,
        autopilot_plans=only(ckey, snapshot.autopilot_plans),
        foreign=frozenset({ckey}) if ckey in snapshot.foreign else frozenset(),
        other_nodeplans=OtherNodePlans(where, ckey, snapshot.other_nodeplans))
        for ckey in keys}


def merge(parts: Mapping[ClusterKey, Snapshot], now: datetime) -> Snapshot:
    """The whole fleet's snapshot from its per-cluster parts (the inverse of :func:`split`)."""
    clusters: dict[ClusterKey, object] = {}
    fields: dict[str, dict[object, object]] = {
        name: {} for name in ("deployments", "machine_sets", "control_planes", "machines",
                              "nodeplans", "nodes", "intents", "autopilot_plans")}
    upgrades: Mapping[tuple[str, str], object] = {}
    foreign: set[ClusterKey] = set()
    for part in parts.values():
        foreign.update(part.foreign)  # any set (a digest's is one key's)
        clusters.update(part.clusters)
        for name, into in fields.items():
            into.update(getattr(part, name))
        upgrades = part.upgrades
    return Snapshot(now=now, clusters=clusters, upgrades=upgrades,  # type: ignore[arg-type]
                    foreign=frozenset(foreign), parts=dict(parts),
                    **fields)  # type: ignore[arg-type]


_MERGED = ("clusters", "deployments", "machine_sets", "control_planes", "machines",
           "nodeplans", "nodes", "intents", "autopilot_plans")


class Merger:
    """:func:`merge`, remembering the last result: the parts that are the same objects as
    last time are not merged again. The previous snapshot's mappings are copied (a C-level
    copy, far cheaper than re-merging a thousand parts) and only the changed parts' entries
    are taken out and put back. Equal to :func:`merge` as mappings (the order of their
    entries may differ)."""

    def __init__(self) -> None:
        self._parts: dict[ClusterKey, Snapshot] = {}
        self._fields: dict[str, dict[object, object]] = {name: {} for name in _MERGED}
        self._foreign: set[ClusterKey] = set()

    def merge(self, parts: Mapping[ClusterKey, Snapshot], now: datetime) -> Snapshot:
        old = self._parts
        changed = [k for k, p in parts.items() if old.get(k) is not p]
        gone = [k for k in old if k not in parts]
        fields, foreign = self._fields, self._foreign
        if len(changed) + len(gone) > len(parts) // 2:  # most moved: start afresh
            for into in fields.values():
                into.clear()
            foreign.clear()
            changed, gone, old = list(parts), [], {}
        for key in (*gone, *changed):
            before = old.get(key)
            if before is None:
                continue
            foreign.difference_update(before.foreign)
            for name, into in fields.items():
                for k in getattr(before, name):
                    into.pop(k, None)
        for key in changed:
            part = parts[key]
            foreign.update(part.foreign)
            for name, into in fields.items():
                into.update(getattr(part, name))
        self._parts = dict(parts)
        upgrades: Mapping[tuple[str, str], object] = {}
        for part in parts.values():  # as merge(): every part holds the fleet's upgrades
            upgrades = part.upgrades
        # The snapshot gets copies: the mappings kept here change with the next merge.
        return Snapshot(now=now, upgrades=upgrades,  # type: ignore[arg-type]
                        foreign=frozenset(foreign), parts=self._parts,
                        **{name: dict(into) for name, into in fields.items()})  # type: ignore[arg-type]


@dataclass(slots=True)
class _Memo:
    part: Snapshot
    result: PlanResult
    holds: HoldAnswers
    verdict: object = None  # the VerdictHold's verdict the answers were last checked with


@dataclass(frozen=True, slots=True)
class IncrementalResult:
    """``result``: the plan of the whole fleet (equal to a full pass);
    ``fresh``: the actions and decisions of the clusters planned in this pass
    (``replanned``): the others' are what their last plan said, already acted on."""

    result: PlanResult
    fresh: PlanResult
    replanned: frozenset[ClusterKey] = field(default_factory=frozenset)
    fresh_by_cluster: Mapping[ClusterKey, PlanResult] = field(default_factory=dict)


def _no_hold(_cluster: ClusterKey, _owner: ObjectRef) -> str | None:
    return None


def _recording(hold: Hold, into: HoldAnswers) -> Hold:
    def recorded(cluster: ClusterKey, owner: ObjectRef) -> str | None:
        answer = hold(cluster, owner)
        into[(cluster, owner)] = answer
        return answer

    return recorded


class IncrementalPlanner:
    """Per-cluster plans, memoised by (the cluster's snapshot part, the hold's answers
    for it, its wake-up time)."""

    def __init__(self, settings: PlannerSettings) -> None:
        self.settings = settings
        self._memo: dict[ClusterKey, _Memo] = {}
        self.replanned_total = 0  # clusters planned, over the planner's life (metrics)

    def forget(self) -> None:
        """Drop every memo: the next pass plans every cluster."""
        self._memo.clear()

    def plan(self, parts: Mapping[ClusterKey, Snapshot], now: datetime, *,
             hold: Hold | None = None, dirty: Iterable[ClusterKey] = ()) -> IncrementalResult:
        """Plan the fleet made of ``parts`` at ``now``. A cluster is planned again when its
        part is a new object (identity: the caller rebuilds a part only when its objects
        changed), it is in ``dirty``, its wake-up time has come, or ``hold`` now answers
        differently for it; otherwise its last plan stands."""
        force = set(dirty)
        for gone in set(self._memo) - set(parts):
            del self._memo[gone]
        verdict = hold.verdict if isinstance(hold, VerdictHold) else None
        replanned: list[ClusterKey] = []
        for ckey in sorted(parts):
            part = parts[ckey]
            memo = self._memo.get(ckey)
            if memo is not None and memo.part is part and ckey not in force \
                    and not _due(memo.result, now):
                # The hold's answers for it: the same when its verdict is (no need to ask).
                now_verdict = verdict(ckey) if verdict is not None else None
                if now_verdict is not None and memo.verdict == now_verdict:
                    continue
                if _same_holds(memo.holds, hold):
                    memo.verdict = now_verdict
                    continue
            answers: HoldAnswers = {}
            if part.now != now:
                part = dataclasses.replace(part, now=now)
            result = plan(part, self.settings, hold=_recording(hold or _no_hold, answers))
            self._memo[ckey] = _Memo(parts[ckey], result, answers,
                                     verdict(ckey) if verdict is not None else None)
            replanned.append(ckey)
        self.replanned_total += len(replanned)
        fresh = {k: self._memo[k].result for k in replanned}
        return IncrementalResult(
            result=_union(self._memo[k].result for k in sorted(self._memo)),
            fresh=_union(fresh.values()), replanned=frozenset(replanned),
            fresh_by_cluster=fresh)


def _due(result: PlanResult, now: datetime) -> bool:
    return result.wake_at is not None and result.wake_at <= now


def _same_holds(recorded: HoldAnswers, hold: Hold | None) -> bool:
    ask = hold or _no_hold
    return all(ask(cluster, owner) == answer for (cluster, owner), answer in recorded.items())


def _union(results: Iterable[PlanResult]) -> PlanResult:
    actions: list[Action] = []
    decisions: list[Decision] = []
    wake: datetime | None = None
    for r in results:
        actions.extend(r.actions)
        decisions.extend(r.decisions)
        if r.wake_at is not None and (wake is None or r.wake_at < wake):
            wake = r.wake_at
    return PlanResult(actions=actions, wake_at=wake, decisions=decisions)


__all__ = ["IncrementalPlanner", "IncrementalResult", "OtherNodePlans", "merge", "split"]
