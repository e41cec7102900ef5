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
import heapq
import weakref
from collections import defaultdict
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from fleet.planner.actions import Action, Decision, PlanResult
from fleet.planner.core import plan
from fleet.planner.policy import DiffableHold, Hold, VerdictHold
from fleet.planner.settings import PlannerSettings
from fleet.world.delta import Delta, DeltaDict, generation, moved_since
from fleet.world.model import ClusterKey, ObjectRef, Snapshot

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


K = TypeVar("K")
V = TypeVar("V")


class _Merged(Mapping[K, V]):
    """One of :class:`Merger`'s merged mappings as a snapshot holds it: the merger's own
    dict, read in place (a pass copies nothing). Before the merger changes its dicts
    (the next merge), every view still referenced somewhere (a snapshot someone kept) is
    given a copy, so a snapshot's mappings never change under its holder. Its ``keys``,
    ``values`` and ``items`` are the dict's own views: iterate them in the pass."""

    __slots__ = ("__weakref__", "_d")

    def __init__(self, d: dict[K, V]) -> None:
        self._d = d

    def __getitem__(self, key: K) -> V:
        return self._d[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def get(self, key: K, default: Any = None) -> Any:
        return self._d.get(key, default)

    def keys(self) -> KeysView[K]:
        return self._d.keys()

    def values(self) -> ValuesView[V]:
        return self._d.values()

    def items(self) -> ItemsView[K, V]:
        return self._d.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Merged):
            other = other._d
        return self._d == other if isinstance(other, dict) else Mapping.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"_Merged({self._d!r})"

    def detach(self) -> None:
        self._d = dict(self._d)


class Merger:
    """:func:`merge`, remembering the last result: the parts that are the same objects as
    last time are not merged again. The merged mappings are kept here and changed in
    place (only the changed parts' entries are taken out and put back); the snapshot
    reads them through views (:class:`_Merged`) that get their own copy only if still
    held when the next merge changes them. Equal to :func:`merge` as mappings (the order
    of their entries may differ)."""

    def __init__(self) -> None:
        self._parts: dict[ClusterKey, Snapshot] = {}
        self._fields: dict[str, dict[object, object]] = {name: {} for name in _MERGED}
        self._foreign: set[ClusterKey] = set()
        self._frozen_foreign: frozenset[ClusterKey] = frozenset()
        self._views: list[weakref.ref[_Merged[object, object]]] = []
        self._told = False  # the last merge was told what moved (see merge's ``moved``)

    def merge(self, parts: Mapping[ClusterKey, Snapshot], now: datetime, *,
              moved: Iterable[ClusterKey] | None = None) -> Snapshot:
        """``moved``: the keys whose part was set or dropped since the last merge (its
        keeper's log, :meth:`fleet.controllers.parts.FleetParts.take_moved`); trusted only
        when the last merge was told too, and only if the count of parts then agrees;
        else (None) the parts are looked at whole."""
        old = self._parts
        changed: list[ClusterKey] | None = None
        told, self._told = self._told, False  # (again once this merge is through)
        if moved is not None and told:
            keys = set(moved)
            changed = [k for k in keys if (p := parts.get(k)) is not None and old.get(k) is not p]
            gone = [k for k in keys if k not in parts and k in old]
            if len(old) + sum(1 for k in changed if k not in old) - len(gone) != len(parts):
                changed = None  # the log missed something: look at all
        if changed is None:
            changed = [k for k, p in parts.items() if old.get(k) is not p]
            gone = [k for k in old if k not in parts] if len(old) + sum(
                1 for k in changed if k not in old) != len(parts) else []
        fields, foreign = self._fields, self._foreign
        if changed or gone:
            for ref in self._views:  # a snapshot still held keeps what it had
                view = ref()
                if view is not None:
                    view.detach()
            self._views = []
        else:  # nothing changes: the views handed out stay right (drop the dead ones)
            self._views = [ref for ref in self._views if ref() is not None]
        moved = (*changed, *gone)
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
        if changed or gone:
            # what moved since the last merge's parts: the stages after read only that
            self._parts = DeltaDict(parts, Delta.after(getattr(self._parts, "delta", None),
                                                       moved))
            self._frozen_foreign = frozenset(foreign)
        upgrades: Mapping[tuple[str, str], object] = (
            self._parts[next(reversed(self._parts))].upgrades if self._parts else {})
        views: dict[str, _Merged[object, object]] = {}
        for name, into in fields.items():
            view = _Merged(into)
            self._views.append(weakref.ref(view))
            views[name] = view
        self._told = moved is not None
        return Snapshot(now=now, upgrades=upgrades,  # type: ignore[arg-type]
                        foreign=self._frozen_foreign, parts=self._parts,
                        **views)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Memo:
    part: Snapshot
    result: PlanResult
    holds: HoldAnswers
    verdict: object = None  # the VerdictHold's verdict the answers were last checked with


class IncrementalResult:
    """``result``: the plan of the whole fleet (equal to a full pass; put together from
    every cluster's plan when first asked for: a pass itself needs only the fresh part);
    ``fresh``: the actions and decisions of the clusters planned in this pass
    (``replanned``): the others' are what their last plan said, already acted on;
    ``wake_at``: the soonest wake-up time of any cluster's plan."""

    __slots__ = ("_memos", "_result", "fresh", "fresh_by_cluster", "replanned", "wake_at")

    def __init__(self, memos: Mapping[ClusterKey, _Memo], fresh: PlanResult, *,
                 replanned: frozenset[ClusterKey] = frozenset(),
                 fresh_by_cluster: Mapping[ClusterKey, PlanResult] | None = None,
                 wake_at: datetime | None = None) -> None:
        self._memos = memos  # a copy: the planner's own changes with the next pass
        self._result: PlanResult | None = None
        self.fresh = fresh
        self.replanned = replanned
        self.fresh_by_cluster: Mapping[ClusterKey, PlanResult] = fresh_by_cluster or {}
        self.wake_at = wake_at

    @classmethod
    def empty(cls) -> IncrementalResult:
        """A pass that planned nothing (nothing known yet, or it could not run)."""
        return cls({}, PlanResult())

    @property
    def result(self) -> PlanResult:
        if self._result is None:
            memos = self._memos
            self._result = _union(memos[k].result for k in sorted(memos))
        return self._result


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
    for it, its wake-up time). A pass costs what moved: the clusters planned again, one
    identity check per cluster, the verdicts the hold says may have moved
    (:class:`~fleet.planner.policy.DiffableHold`), and the wake-up times that came (a
    heap); the fleet's whole plan is put together only when asked for."""

    def __init__(self, settings: PlannerSettings) -> None:
        self.settings = settings
        self._memo: dict[ClusterKey, _Memo] = {}
        # (wake_at, cluster) of every memo with a wake-up time; an entry whose memo was
        # replaced since is dropped when it comes up.
        self._wakes: list[tuple[datetime, ClusterKey]] = []
        # The last pass's hold when it can tell what moved since (every memo's verdict
        # was checked against it), else None: the next pass checks every memo.
        self._hold: object | None = None
        # The last pass had no hold at all (every memo's answers are "go"): a pass without
        # a hold then has no answer to check again.
        self._no_hold = False
        # The generation of the parts the last pass planned (fleet.world.delta; 0: none
        # or not known): the next pass then looks only at the parts that moved since.
        self._parts_gen = 0
        self.replanned_total = 0  # clusters planned, over the planner's life (metrics)

    def forget(self) -> None:
        """Drop every memo: the next pass plans every cluster."""
        self._memo.clear()
        self._wakes.clear()
        self._hold = None
        self._no_hold = False
        self._parts_gen = 0

    def plan(self, parts: Mapping[ClusterKey, Snapshot], now: datetime, *,
             hold: Hold | None = None, dirty: Iterable[ClusterKey] = ()) -> IncrementalResult:
        """Plan the fleet made of ``parts`` at ``now``. A cluster is planned again when its
        part is a new object (identity: the caller rebuilds a part only when its objects
        changed), it is in ``dirty``, its wake-up time has come, or ``hold`` now answers
        differently for it; otherwise its last plan stands."""
        memos = self._memo
        todo = {k for k in dirty if k in parts}
        moved_parts = moved_since(parts, self._parts_gen)
        self._parts_gen = 0  # (set again once this pass planned everything it must)
        if moved_parts is not None:  # the parts planned last, and what moved since
            for ckey in moved_parts:
                part = parts.get(ckey)
                if part is None:
                    memos.pop(ckey, None)
                elif (memo := memos.get(ckey)) is None or memo.part is not part:
                    todo.add(ckey)
        else:
            new = 0
            for ckey, part in parts.items():
                memo = memos.get(ckey)
                if memo is None:
                    new += 1
                    todo.add(ckey)
                elif memo.part is not part:
                    todo.add(ckey)
            if len(memos) + new != len(parts):  # some left
                for gone in [k for k in memos if k not in parts]:
                    del memos[gone]
        todo.update(self._due(now))
        verdict = hold.verdict if isinstance(hold, VerdictHold) else None
        # (a runtime Protocol check walks the protocol's members: asked once per pass)
        diff = hold if isinstance(hold, DiffableHold) else None
        if diff is not None and self._hold is not None:
            moved = diff.moved_since(self._hold)
        else:  # without a hold now and before, no answer moved
            moved = frozenset() if hold is None and self._no_hold else None
        # The others: planned again only if the hold now answers differently for them.
        for ckey in (memos.keys() if moved is None else moved & memos.keys()):
            if ckey in todo:
                continue
            memo = memos[ckey]
            # The hold's answers for it: the same when its verdict is (no need to ask).
            now_verdict = verdict(ckey) if verdict is not None else None
            if now_verdict is not None and memo.verdict == now_verdict:
                continue
            if _same_holds(memo.holds, hold):
                memo.verdict = now_verdict
                continue
            todo.add(ckey)
        # Until every cluster to plan is planned, no memo is known to match this hold: a
        # pass that fails half-way (an unreadable object) leaves the next one checking all.
        self._hold = None
        self._no_hold = False
        replanned = sorted(todo)
        done = 0
        try:
            for ckey in replanned:
                answers: HoldAnswers = {}
                part = parts[ckey]
                if part.now != now:
                    part = dataclasses.replace(part, now=now)
                result = plan(part, self.settings, hold=_recording(hold or _no_hold, answers))
                memos[ckey] = _Memo(parts[ckey], result, answers,
                                    verdict(ckey) if verdict is not None else None)
                if result.wake_at is not None:
                    heapq.heappush(self._wakes, (result.wake_at, ckey))
                done += 1
        except BaseException:
            for ckey in replanned[done:]:  # not planned: planned afresh next pass
                memos.pop(ckey, None)
            raise
        self._hold = diff
        self._no_hold = hold is None
        self._parts_gen = generation(parts)
        if len(self._wakes) > 2 * len(memos) + 64:  # many replaced: keep the live ones
            self._wakes = [(m.result.wake_at, k) for k, m in memos.items()
                           if m.result.wake_at is not None]
            heapq.heapify(self._wakes)
        self.replanned_total += len(replanned)
        fresh = {k: memos[k].result for k in replanned}
        return IncrementalResult(
            dict(memos), _union(fresh.values()), replanned=frozenset(replanned),
            fresh_by_cluster=fresh, wake_at=self._next_wake())

    def _live(self, entry: tuple[datetime, ClusterKey]) -> bool:
        memo = self._memo.get(entry[1])
        return memo is not None and memo.result.wake_at == entry[0]

    def _due(self, now: datetime) -> list[ClusterKey]:
        """The clusters whose wake-up time came (their entries taken off the heap)."""
        due: list[ClusterKey] = []
        wakes = self._wakes
        while wakes and wakes[0][0] <= now:
            entry = heapq.heappop(wakes)
            if self._live(entry):
                due.append(entry[1])
        return due

    def _next_wake(self) -> datetime | None:
        wakes = self._wakes
        while wakes and not self._live(wakes[0]):
            heapq.heappop(wakes)
        return wakes[0][0] if wakes else None


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
