"""The incremental planner equals a full re-plan.

The world changes by random events; like the controller, the test rebuilds the snapshot
part of only the clusters an event touched (the clusters of the actions it performed, of
the node that moved, of the object annotated...), keeps the other parts as they were,
and acts only on what the clusters planned in this pass decided. After every pass the
whole-fleet answer of :class:`IncrementalPlanner` must equal :func:`plan` of the whole,
fresh snapshot: same actions per object in the same order, same wake-up, same decisions.
A missed dependency (time, the policy's hold, another cluster) shows up as a difference.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.contract.signal import SignalState
from fleet.controllers.dispatcher import action_target
from fleet.planner import PlannerSettings, PlanResult, incremental, plan
from fleet.planner.actions import Action, ClearSignal, UncordonNode
from fleet.planner.incremental import (
    IncrementalPlanner,
    IncrementalResult,
    Merger,
    merge,
    split,
)
from fleet.planner.policy import Hold
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.world.delta import generation, moved_since
from fleet.world.model import ANN_RETRY, KIND_MD, ClusterKey, ObjectRef, Snapshot
from tests.unit.test_planner_properties import T0, V2, V3, _nodes, fleets


def by_object(actions: list[Action]) -> dict[tuple[str, ...], list[Action]]:
    out: dict[tuple[str, ...], list[Action]] = defaultdict(list)
    for a in actions:
        out[action_target(a)].append(a)
    return dict(out)


def assert_same(inc: PlanResult, full: PlanResult) -> None:
    assert by_object(inc.actions) == by_object(full.actions)
    assert inc.wake_at == full.wake_at
    key = lambda d: (d.owner, d.target)  # noqa: E731
    assert sorted(inc.decisions, key=key) == sorted(full.decisions, key=key)


class Controller:
    """What the controller does around the planner, on a simulated world."""

    def __init__(self, sim: SimFleet, cfg: PlannerSettings, *, verdicts: str = "",
                 merged: bool = False) -> None:
        self.sim, self.cfg = sim, cfg
        # merged: the parts planned are the Merger's (as the controller's): they say which
        # moved since the last merge (fleet.world.delta), and the planner looks at those
        self.merger = Merger() if merged else None
        # The hold as a VerdictHold ("verdicts": the planner asks only the clusters whose
        # verdict moved) or a DiffableHold ("diff", as the rollout policy's is: the hold
        # names those clusters, the planner does not look at the others at all).
        self.verdicts = verdicts
        self.planner = IncrementalPlanner(cfg)
        self.parts: dict[ClusterKey, Snapshot] = {}
        self.dirty: set[ClusterKey] = set()
        self.held: set[object] = set()
        self.rebuilt = 0

    def touch(self, ckey: ClusterKey) -> None:
        self.dirty.add(ckey)

    def hold(self, cluster: ClusterKey, owner: ObjectRef) -> str | None:
        if cluster in self.held:
            return "cluster held"
        return "object held" if owner in self.held else None

    @property
    def the_hold(self) -> Hold | None:
        held = frozenset(self.held)
        if self.verdicts == "none":  # no hold at all while nothing is held (no policy)
            return self.hold if held else None
        return _DiffVerdicts(held) if self.verdicts == "diff" else _Verdicts(held) \
            if self.verdicts else self.hold

    def refresh(self) -> None:
        fresh = split(self.sim.snapshot())
        for ckey in set(self.parts) - set(fresh):
            del self.parts[ckey]
        for ckey, part in fresh.items():
            if ckey in self.dirty or ckey not in self.parts:
                self.parts[ckey] = part
                self.rebuilt += 1
        self.dirty.clear()

    def run_pass(self, crash_after: int | None = None) -> IncrementalResult:
        self.refresh()
        parts = self.parts if self.merger is None else \
            self.merger.merge(self.parts, self.sim.now).parts
        assert parts is not None
        inc = self.planner.plan(parts, self.sim.now, hold=self.the_hold)
        assert_same(inc.result, plan(self.sim.snapshot(), self.cfg, hold=self.hold))
        done = 0
        for ckey, result in inc.fresh_by_cluster.items():
            for a in result.actions:
                if crash_after is not None and done >= crash_after:
                    break
                self.sim.apply(a)
                self.touch(ckey)
                done += 1
        if crash_after is not None:  # the controller died: a new one starts from scratch
            self.planner = IncrementalPlanner(self.cfg)
        return inc


@dataclass(frozen=True)
class _Verdicts:
    """``Controller.hold`` as a VerdictHold: a cluster's verdict is whether it is held and
    which objects are (any cluster's: coarse, but equal verdicts mean equal answers)."""

    held: frozenset[object]

    def __call__(self, cluster: ClusterKey, owner: ObjectRef) -> str | None:
        if cluster in self.held:
            return "cluster held"
        return "object held" if owner in self.held else None

    def verdict(self, cluster: ClusterKey) -> object:
        return (cluster in self.held, frozenset(h for h in self.held if isinstance(h, ObjectRef)))


@dataclass(frozen=True)
class _DiffVerdicts(_Verdicts):
    """:class:`_Verdicts` that also names what moved since an earlier one."""

    def moved_since(self, before: object) -> frozenset[ClusterKey] | None:
        if not isinstance(before, _Verdicts):
            return None
        if {h for h in self.held ^ before.held if isinstance(h, ObjectRef)}:
            return None  # an object's hold is in every cluster's verdict
        return frozenset(self.held ^ before.held)  # type: ignore[arg-type]


EVENTS = ["plan", "plan", "plan", "crash", "node", "node", "node", "fail", "ready", "time",
          "time", "retry", "delete", "bump", "hold", "hold"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.data())
def test_incremental_equals_full_replan(fleet: tuple[SimFleet, PlannerSettings],
                                        data: st.DataObject) -> None:
    sim, cfg = fleet
    ctl = Controller(sim, cfg, verdicts=data.draw(st.sampled_from(["", "verdicts", "diff", "none"]),
                                                  label="verdicts"),
                     merged=data.draw(st.booleans(), label="merged"))

    for _ in range(data.draw(st.integers(10, 80), label="steps")):
        event = data.draw(st.sampled_from(EVENTS), label="event")
        if event == "plan":
            ctl.run_pass()
        elif event == "crash":
            ctl.run_pass(crash_after=data.draw(st.integers(0, 6), label="prefix"))
        elif event in ("node", "fail") and (active := sim.active_requests()):
            ckey, name = data.draw(st.sampled_from(active), label="node")
            fail = data.draw(st.sampled_from([SignalState.FAILED_DOWNLOAD,
                                              SignalState.ROLLED_BACK])) if event == "fail" \
                else None
            sim.step_node(ckey, name, fail=fail)
            ctl.touch(ckey)
        elif event == "ready" and (all_nodes := _nodes(sim)):
            ckey, name = data.draw(st.sampled_from(all_nodes), label="toggle")
            nodes = sim.nodes[ckey]
            assert nodes is not None
            nodes[name] = dataclasses.replace(nodes[name], ready=not nodes[name].ready)
            ctl.touch(ckey)
        elif event == "time":
            sim.advance(data.draw(st.sampled_from([1, 10, 61, 200]), label="seconds"))
        elif event == "retry" and sim.deployments:
            key = data.draw(st.sampled_from(sorted(sim.deployments)), label="md")
            sim.annotate(KIND_MD, key, ANN_RETRY, str(sim.now.timestamp()))
            ctl.touch((key[0], sim.deployments[key].cluster))
        elif event == "delete" and (plans := sorted(k for k, p in sim.nodeplans.items()
                                                   if not p.deleting)):
            key = data.draw(st.sampled_from(plans), label="delete")
            ctl.touch((key[0], sim.nodeplans[key].cluster))
            sim.delete_plan(key)
        elif event == "bump" and sim.clusters:
            ckey = data.draw(st.sampled_from(sorted(sim.clusters)), label="bump")
            bump(sim, ckey, V3)
            ctl.touch(ckey)
        elif event == "hold":
            # The fleet gate changes its mind about a cluster or one object: no cluster
            # is touched, the planner must notice by itself.
            owners: list[object] = [md.ref for md in sim.deployments.values()]
            owners += [kcp.ref for kcp in sim.control_planes.values()]
            pick = data.draw(st.sampled_from([*sorted(sim.clusters), *owners]), label="hold")
            ctl.held ^= {pick}

    # Heal, and drive the rollout to its end with the incremental planner alone.
    ctl.held.clear()
    for ckey, nodes in sim.nodes.items():
        for name, node in list((nodes or {}).items()):
            nodes[name] = dataclasses.replace(node, ready=True, unschedulable=False,  # type: ignore[index]
                                              cordoned_by=None)
        ctl.touch(ckey)
    for _ in range(400):
        inc = ctl.run_pass()
        active = sim.active_requests()
        for ckey, name in active:
            sim.finish_node(ckey, name)
            ctl.touch(ckey)
        sim.advance(1)
        if not inc.fresh.actions and not active and not ctl.dirty:
            break
    else:
        raise AssertionError("the fleet did not settle under the incremental planner")


def test_a_quiet_fleet_plans_only_the_cluster_that_moved() -> None:
    """100 settled clusters; one node completes: one cluster is planned, not 100."""
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i:03d}", control_planes=1, workers=3) for i in range(100)]
    cfg = PlannerSettings(default_deadline=timedelta(hours=1))
    ctl = Controller(sim, cfg)
    assert len(ctl.run_pass().replanned) == 100
    while ctl.run_pass().fresh.actions:  # first status writes
        pass
    assert ctl.run_pass().replanned == frozenset()  # nothing moved: nothing planned
    bump(sim, keys[42], V2, control_plane=False, workers=True)
    ctl.touch(keys[42])
    inc = ctl.run_pass()
    assert inc.replanned == {keys[42]}
    assert inc.fresh.actions, "the bumped cluster starts a worker"
    assert {a for a in inc.result.actions} == {a for a in inc.fresh.actions}


def test_a_hold_change_replans_only_the_clusters_it_answers_for() -> None:
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i}", control_planes=0, workers=2) for i in range(5)]
    for k in keys:
        bump(sim, k, V2, control_plane=False, workers=True)
    cfg = PlannerSettings(default_deadline=timedelta(hours=1))
    ctl = Controller(sim, cfg)
    ctl.held = set(keys)
    assert len(ctl.run_pass().replanned) == 5
    while ctl.run_pass().fresh.actions:  # first status writes
        pass
    assert not ctl.run_pass().replanned
    ctl.held.discard(keys[3])  # the gate admits one cluster
    inc = ctl.run_pass()
    assert inc.replanned == {keys[3]}
    assert inc.fresh.actions


def test_split_then_merge_is_the_snapshot() -> None:
    sim = SimFleet(now=T0)
    for i in range(3):
        bump(sim, add_cluster(sim, f"c{i}", namespace=f"ns{i % 2}"), V2)
    plan_result = plan(sim.snapshot(), PlannerSettings())
    sim.apply_all(plan_result.actions)
    snap = sim.snapshot()
    assert merge(split(snap), snap.now) == snap


def test_a_deadline_replans_a_cluster_nothing_touched() -> None:
    """A silent node: no event comes, the cluster's own wake-up time re-plans it and its
    NodePlan fails by deadline, as a full pass would decide."""
    sim = SimFleet(now=T0)
    ckey = add_cluster(sim, "c0", control_planes=0, workers=2, max_unavailable=1)
    other = add_cluster(sim, "c1", control_planes=0, workers=2)
    bump(sim, ckey, V2, control_plane=False, workers=True)
    cfg = PlannerSettings(default_deadline=timedelta(seconds=30))
    ctl = Controller(sim, cfg)
    while ctl.run_pass().fresh.actions:  # dispatch and signal; the node never answers
        pass
    assert sim.active_requests()
    assert not ctl.run_pass().replanned
    sim.advance(31)
    inc = ctl.run_pass()
    assert inc.replanned == {ckey} and other not in inc.replanned
    assert any(type(a).__name__ == "MarkNodePlanFailed" for a in inc.fresh.actions)


def test_a_part_leaves_another_clusters_request_alone_on_a_shared_node_list() -> None:
    """Workload clusters sharing an API server (the test world's) see each other's Nodes:
    cluster a's part holds b's node with b's live request. Planned on its own, a's part
    must not take that request for an orphan (it names a NodePlan of another part), as the
    whole fleet's plan does not; without ``other_nodeplans`` it would clear it."""
    sim = SimFleet(now=T0)
    a = add_cluster(sim, "a", namespace="fleet", control_planes=1, workers=1)
    b = add_cluster(sim, "b", namespace="fleet", control_planes=1, workers=1)
    bump(sim, b, V2)
    for _ in range(5):
        sim.apply_all(plan(sim.snapshot(), PlannerSettings()).actions)
    assert sim.active_requests(), "b has a node with a live request"
    full = sim.snapshot()
    shared = {**(full.nodes[a] or {}), **(full.nodes[b] or {})}
    whole = dataclasses.replace(full, nodes={a: shared, b: full.nodes[b]})
    assert not [x for x in plan(whole, PlannerSettings()).actions
                if isinstance(x, ClearSignal | UncordonNode)]
    parts = split(whole)
    assert set(parts[a].other_nodeplans) == {k for k, p in whole.nodeplans.items()
                                             if p.cluster == "b"}
    inc = IncrementalPlanner(PlannerSettings()).plan(parts, whole.now)
    assert not [x for x in inc.result.actions if isinstance(x, ClearSignal | UncordonNode)]
    blind = dataclasses.replace(parts[a], other_nodeplans=frozenset())
    assert [x for x in plan(blind, PlannerSettings()).actions if isinstance(x, ClearSignal)]


@pytest.mark.parametrize("told", [False, True], ids=["looked-for", "told"])
def test_the_merger_equals_merge_while_parts_move_come_and_go(told: bool) -> None:
    """Merger.merge (re-merging only the parts that are new objects) equals merge()
    through a rollout in some clusters, a cluster leaving and one coming back; "told":
    each merge is told which parts moved (as the controller's, from FleetParts' log),
    and once a log that missed a cluster coming back (the count disagrees: looked at
    whole)."""
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i}", namespace=f"ns{i % 2}", control_planes=1, workers=2)
            for i in range(6)]
    cfg = PlannerSettings(default_deadline=timedelta(hours=1))
    merger = Merger()
    parts = split(sim.snapshot())
    assert merger.merge(parts, sim.now, moved=set(parts) if told else None) == \
        merge(parts, sim.now)
    before = parts
    bump(sim, keys[1], V2)
    bump(sim, keys[4], V2, control_plane=False, workers=True)
    for step in range(40):
        sim.apply_all(plan(sim.snapshot(), cfg).actions)
        for active in sim.active_requests()[:1]:
            sim.step_node(*active)
        sim.advance(1)
        fresh = split(sim.snapshot())
        # Only the clusters that moved get new part objects, as in the controller.
        parts = {k: parts[k] if k in parts and parts[k] == p else p
                 for k, p in fresh.items()}
        if step == 10:
            parts.pop(keys[2])  # a cluster leaves the fleet
        elif step > 20:
            parts[keys[2]] = fresh[keys[2]]
        if step == 15:
            parts = {k: dataclasses.replace(p, foreign=frozenset({k}))
                     for k, p in parts.items()}  # every part moved at once
        log = {k for k in parts.keys() | before.keys() if parts.get(k) is not before.get(k)}
        if step == 21:
            log.discard(keys[2])  # a log that missed it
        merged = merger.merge(parts, sim.now, moved=log if told else None)
        assert merged == merge(parts, sim.now)
        assert merged.parts == parts
        before = parts


def _held_fleet(n: int) -> tuple[SimFleet, PlannerSettings, Controller, list[ClusterKey]]:
    """``n`` clusters bumped and all held by a diffable hold, their first writes done."""
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i}", control_planes=0, workers=2) for i in range(n)]
    for k in keys:
        bump(sim, k, V2, control_plane=False, workers=True)
    cfg = PlannerSettings(default_deadline=timedelta(hours=1))
    ctl = Controller(sim, cfg, verdicts="diff")
    ctl.held = set(keys)
    ctl.run_pass()
    while ctl.run_pass().fresh.actions:  # first status writes
        pass
    return sim, cfg, ctl, keys


def test_a_diffable_hold_names_the_clusters_looked_at() -> None:
    """With a hold that names what moved (the rollout's), a pass asks the hold about those
    clusters only, not about every cluster of the fleet; a cluster it names whose answer
    did change is planned again."""
    sim, _, ctl, keys = _held_fleet(20)
    asked: list[ClusterKey] = []

    class Counting(_DiffVerdicts):
        def verdict(self, cluster: ClusterKey) -> object:
            asked.append(cluster)
            return super().verdict(cluster)

    ctl.held.discard(keys[7])
    inc = ctl.planner.plan(ctl.parts, sim.now, hold=Counting(frozenset(ctl.held)))
    assert inc.replanned == {keys[7]}
    assert set(asked) == {keys[7]}, "only the cluster the hold named was asked about"
    assert inc.fresh.actions
    asked.clear()
    inc = ctl.planner.plan(ctl.parts, sim.now, hold=Counting(frozenset(ctl.held)))
    assert not inc.replanned and not asked


def test_passes_without_a_hold_ask_nothing_again_until_a_hold_came_and_went(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller without a policy plans with no hold: a pass after a pass without one
    checks no cluster's recorded answers (they are all "go", at 1000 clusters that was a
    third of the controller's CPU while one cluster rolled), and a pass without a hold
    after one with a hold re-plans the clusters it held."""
    from fleet.planner import incremental  # noqa: PLC0415

    checked: list[object] = []
    real = incremental._same_holds

    def counting(recorded: Any, hold: Any) -> bool:
        checked.append(hold)
        return real(recorded, hold)

    monkeypatch.setattr(incremental, "_same_holds", counting)
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i}", control_planes=0, workers=2) for i in range(6)]
    for k in keys:
        bump(sim, k, V2, control_plane=False, workers=True)
    ctl = Controller(sim, PlannerSettings(default_deadline=timedelta(hours=1)),
                     verdicts="none")
    ctl.held = {keys[2]}
    while ctl.run_pass().fresh.actions:  # held: a plain hold, asked of every cluster
        pass
    assert checked
    ctl.held.clear()  # now no hold at all
    inc = ctl.run_pass()
    assert keys[2] in inc.replanned and inc.fresh.actions, "the cluster held before starts"
    while ctl.run_pass().fresh.actions:
        pass
    checked.clear()
    inc = ctl.run_pass()
    assert not inc.replanned and not checked, "no hold then and now: nothing asked again"


def test_wake_up_times_come_from_the_clusters_plans() -> None:
    """The pass's wake-up is the soonest of every cluster's plan (kept in a heap, not
    found by walking the fleet; run_pass checks it against the full plan's), and when it
    comes, the cluster it is of is planned again, not the other."""
    sim = SimFleet(now=T0)
    a = add_cluster(sim, "a", control_planes=0, workers=2, max_unavailable=1)
    b = add_cluster(sim, "b", control_planes=0, workers=2, max_unavailable=1)
    bump(sim, a, V2, control_plane=False, workers=True)
    cfg = PlannerSettings(default_deadline=timedelta(seconds=30))
    ctl = Controller(sim, cfg)
    while ctl.run_pass().fresh.actions:  # a's first node: dispatched and signalled
        pass
    sim.advance(2)
    bump(sim, b, V2, control_plane=False, workers=True)
    ctl.touch(b)
    while ctl.run_pass().fresh.actions:  # b's: two seconds later
        pass
    inc = ctl.run_pass()
    own = {k: plan(p, cfg).wake_at for k, p in split(sim.snapshot()).items()}
    assert own[a] is not None and own[b] is not None and own[a] < own[b]
    assert inc.wake_at == own[a] and not inc.replanned
    sim.now = own[a]
    inc = ctl.run_pass()
    assert inc.replanned == {a}
    assert inc.wake_at is not None and inc.wake_at > own[a]


def test_a_merger_told_what_moved_looks_only_there_and_whole_when_the_log_is_short(
        ) -> None:
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i}", control_planes=1, workers=2) for i in range(8)]
    merger = Merger()
    parts = split(sim.snapshot())
    first = merger.merge(parts, sim.now, moved=set(parts))
    bump(sim, keys[3], V2)
    sim.apply_all(plan(sim.snapshot(), PlannerSettings()).actions)
    fresh = split(sim.snapshot())
    parts = {**parts, keys[3]: fresh[keys[3]]}
    gone = parts.pop(keys[5])
    merged = merger.merge(parts, sim.now, moved={keys[3], keys[5]})
    assert merged == merge(parts, sim.now) and merged.nodeplans
    # and the merged parts say so to who read the last ones (the planner, the progress)
    assert moved_since(merged.parts, generation(first.parts)) == {keys[3], keys[5]}
    parts = {**parts, keys[5]: gone}  # back, and the log misses it: the count disagrees
    merged = merger.merge(parts, sim.now, moved=set())
    assert merged == merge(parts, sim.now)


def test_a_merged_snapshot_kept_does_not_change_with_the_next_merge() -> None:
    """The merger's snapshot reads its own mappings in place (no copy per pass); one that
    is still held when the next merge changes them keeps what it had."""
    sim = SimFleet(now=T0)
    keys = [add_cluster(sim, f"c{i}", control_planes=1, workers=2) for i in range(4)]
    merger = Merger()
    parts = split(sim.snapshot())
    kept = merger.merge(parts, sim.now)
    before = {name: dict(getattr(kept, name)) for name in ("machines", "nodes", "nodeplans")}
    bump(sim, keys[2], V2)
    sim.apply_all(plan(sim.snapshot(), PlannerSettings()).actions)  # a NodePlan created
    fresh = split(sim.snapshot())
    parts = {**parts, keys[2]: fresh[keys[2]]}
    parts.pop(keys[0])
    merged = merger.merge(parts, sim.now)
    assert merged == merge(parts, sim.now)
    assert merged.nodeplans and not before["nodeplans"]
    for name, was in before.items():
        assert dict(getattr(kept, name)) == was, name
    again = merger.merge(parts, sim.now)  # nothing moved: the same mappings, still right
    assert again == merged and again.nodeplans == merged.nodeplans


def test_a_pass_that_fails_half_way_plans_the_rest_next_time(monkeypatch: Any) -> None:
    """An unreadable object makes planning one cluster raise: the clusters that were not
    planned in that pass are planned in the next one (their hold moved, their wake-up
    came), not taken for settled."""
    sim, cfg, ctl, keys = _held_fleet(3)
    real = incremental.plan
    calls: list[object] = []

    def failing(part: Snapshot, *args: Any, **kw: Any) -> PlanResult:
        calls.append(part)
        if len(calls) == 2:
            raise ValueError("unreadable object")
        return real(part, *args, **kw)

    monkeypatch.setattr(incremental, "plan", failing)
    ctl.held.clear()  # every cluster admitted at once
    with pytest.raises(ValueError):
        ctl.planner.plan(ctl.parts, sim.now, hold=_DiffVerdicts(frozenset()))
    monkeypatch.setattr(incremental, "plan", real)
    inc = ctl.planner.plan(ctl.parts, sim.now, hold=_DiffVerdicts(frozenset()))
    assert inc.replanned == set(keys[1:]), "the failed cluster and the one after it"
    assert_same(inc.result, plan(sim.snapshot(), cfg))
