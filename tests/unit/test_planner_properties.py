"""Property tests: random fleets, states, failures, crashes and event orders.

After every planning pass (and every partial pass: the controller may die after any
prefix of its actions) an independent oracle checks, from the physical state alone:

* no MachineDeployment is pushed above maxUnavailable by a dispatch;
* never two control planes of a cluster are being upgraded at once, and a control plane
  is dispatched only while every other control-plane node is Ready;
* no worker is dispatched while a control plane of its cluster is out of date (neither
  recorded on its Machine nor run by its Ready node) or moving;
* a node's live request is never overwritten by another NodePlan's;
* a request that takes a node down (its node was available before the signal) never
  leaves its MachineDeployment with more than maxUnavailable nodes physically down, nor
  a cluster with two control planes down: peers may have gone NotReady since the
  NodePlan was created.

Then the world heals and every eligible Machine must end up upgraded.
"""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import SignalState
from fleet.contract.versions import K0sVersion, same_version
from fleet.planner import PENDING, PlannerSettings, plan
from fleet.planner.actions import Action, CreateNodePlan, SignalNode
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.world.budget import UnavailabilityBudget
from fleet.world.model import (
    ANN_RETRY,
    KIND_MD,
    ROLE_CONTROLLER,
    ClusterKey,
    MachineInfo,
    NodeInfo,
    NodePlanInfo,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
V1, V2, V3 = "v1.31.2+k0s.0", "v1.31.3+k0s.0", "v1.31.4+k0s.0"


# -- the oracle: physical state only, written independently of the planner ----------------

def _answer(p: NodePlanInfo, node: NodeInfo | None) -> SignalState | None:
    if node is None or node.signal is None or p.started_at is None:
        return None
    s = node.signal
    if s.planId != p.plan_id or s.created != p.started_at or s.status is None:
        return None
    return s.status.status


def _live(node: NodeInfo | None) -> bool:
    return node is not None and node.signal is not None and (
        node.signal.status is None or not node.signal.status.status.terminal)


def taken(sim: SimFleet, m: MachineInfo, target: str | None) -> bool:
    """The node is being upgraded by us, or a failure for the target is not cleared."""
    nodes = sim.nodes.get((m.ref.namespace, m.cluster)) or {}
    node = nodes.get(m.node_name)
    if _live(node):
        return True
    for p in sim.nodeplans.values():
        if p.ref.namespace != m.ref.namespace or p.machine != m.ref.name:
            continue
        answer = _answer(p, node)
        failed = p.phase == NodePlanPhase.FAILED or (answer is not None and answer.failed)
        if failed and same_version(p.version, target) and not p.deleting:
            return True
        if p.phase in (NodePlanPhase.PENDING, NodePlanPhase.IN_PROGRESS) and not p.deleting \
                and answer is None:
            return True  # dispatched, not yet answered
    return False


def unavailable(sim: SimFleet, m: MachineInfo, target: str | None) -> bool:
    nodes = sim.nodes.get((m.ref.namespace, m.cluster))
    node = None if nodes is None else nodes.get(m.node_name)
    return node is None or not node.ready or node.unschedulable or m.deleting or taken(
        sim, m, target)


def check_pass(sim: SimFleet, before: SimFleet, actions: list[Action]) -> None:
    creates = [a for a in actions if isinstance(a, CreateNodePlan)]
    for md in sim.deployments.values():
        mine = [a for a in creates if a.owner == md.ref]
        if not mine:
            continue
        machines = [m for m in sim.machines.values() if m.owner == md.ref]
        limit = UnavailabilityBudget.resolve(md.max_unavailable, md.replicas).limit
        missing = max(0, md.replicas - len([m for m in machines if not m.deleting]))
        after = sum(unavailable(sim, m, md.version) for m in machines) + missing
        assert after <= limit, f"{md.ref}: {after} unavailable > {limit} after {mine}"
    for ckey in sim.clusters:
        cps = [m for m in sim.machines.values()
               if (m.ref.namespace, m.cluster) == ckey and m.role == ROLE_CONTROLLER]
        kcp_target = {k.ref: k.version for k in sim.control_planes.values()}
        moving = [m.ref.name for m in cps if taken(sim, m, kcp_target.get(m.owner))]  # type: ignore[arg-type]
        cp_creates = [a for a in creates if a.cluster == ckey and a.role == ROLE_CONTROLLER]
        if cp_creates:
            assert len(moving) <= 1, f"two control planes at once in {ckey}: {moving}"
            [a] = cp_creates
            bnodes = before.nodes.get(ckey) or {}
            for m in cps:
                n = bnodes.get(m.node_name)
                assert n is not None and n.ready, f"{a.machine.name} dispatched, {m} not Ready"
        w_creates = [a for a in creates if a.cluster == ckey and a.role != ROLE_CONTROLLER]
        if w_creates:
            bcps = [m for m in before.machines.values()
                    if (m.ref.namespace, m.cluster) == ckey and m.role == ROLE_CONTROLLER]
            bnodes = before.nodes.get(ckey) or {}
            for m in bcps:
                target = kcp_target.get(m.owner)  # type: ignore[arg-type]
                # On the target: recorded on its Machine, or its node runs it and is Ready
                # (a completion whose Machine write has not landed yet).
                n = bnodes.get(m.node_name)
                done = n is not None and n.ready and same_version(n.running_version, target)
                assert same_version(m.version, target) or done, \
                    f"worker before control plane {m}"
                assert not taken(before, m, target), f"worker while {m} moves"


def check_signal(sim: SimFleet, a: SignalNode) -> None:
    nodes = sim.nodes.get(a.cluster) or {}
    node = nodes.get(a.node)
    if node is None or node.signal is None or node.signal.planId == a.request.plan_id:
        return
    ns, _, name = node.signal.planId.partition("/")
    other = sim.nodeplans.get((ns, name))
    if other is not None and not other.terminal:
        assert not _live(node), f"{a.request.plan_id} overwrote live request {node.signal.planId}"


def physically_down(sim: SimFleet, m: MachineInfo) -> bool:
    """What the cluster sees, whatever any NodePlan says: the node is gone, NotReady,
    cordoned, or carries a live request; or its Machine is being deleted."""
    nodes = sim.nodes.get((m.ref.namespace, m.cluster))
    node = None if nodes is None else nodes.get(m.node_name)
    return m.deleting or node is None or not node.ready or node.unschedulable or _live(node)


def check_signal_budget(before: SimFleet, sim: SimFleet, a: SignalNode) -> None:
    """Called after ``a`` was applied to ``sim``; ``before`` is the world just before."""
    [m] = [m for m in sim.machines.values()
           if (m.ref.namespace, m.cluster) == a.cluster and m.node_name == a.node]
    if physically_down(before, m):
        return  # it was down already: the signal takes nothing more down
    if m.role == ROLE_CONTROLLER:
        down = sorted(o.ref.name for o in sim.machines.values()
                      if (o.ref.namespace, o.cluster) == a.cluster
                      and o.role == ROLE_CONTROLLER and physically_down(sim, o))
        assert down == [m.ref.name], f"{a.request.plan_id}: control planes down {down}"
        return
    md = next(d for d in sim.deployments.values() if d.ref == m.owner)
    machines = [o for o in sim.machines.values() if o.owner == md.ref]
    limit = UnavailabilityBudget.resolve(md.max_unavailable, md.replicas).limit
    missing = max(0, md.replicas - len([o for o in machines if not o.deleting]))
    down = sorted(o.ref.name for o in machines if physically_down(sim, o))
    assert len(down) + missing <= limit, (
        f"{a.request.plan_id} signalled: {down} (+{missing} missing) down > {limit}")


def copy_fleet(sim: SimFleet) -> SimFleet:
    return dataclasses.replace(
        sim, clusters=dict(sim.clusters), deployments=dict(sim.deployments),
        machine_sets=dict(sim.machine_sets), control_planes=dict(sim.control_planes),
        machines=dict(sim.machines), nodeplans=dict(sim.nodeplans),
        nodes={k: (None if v is None else dict(v)) for k, v in sim.nodes.items()},
        log=[], created=[])


def run_pass(sim: SimFleet, cfg: PlannerSettings, crash_after: int | None = None) -> int:
    before = copy_fleet(sim)
    actions = plan(sim.snapshot(), cfg).actions
    if crash_after is not None:
        actions = actions[:crash_after]  # the controller died mid-way
    for a in actions:
        if isinstance(a, SignalNode):
            check_signal(sim, a)
            just_before = copy_fleet(sim)
            sim.apply(a)
            check_signal_budget(just_before, sim, a)
        else:
            sim.apply(a)
    check_pass(sim, before, actions)
    return len(actions)


# -- strategies ------------------------------------------------------------------------------

max_unavailable = st.one_of(st.integers(0, 4), st.sampled_from(["25%", "50%", "34%", "100%"]))


@st.composite
def fleets(draw: st.DrawFn) -> tuple[SimFleet, PlannerSettings]:
    sim = SimFleet(now=T0)
    for i in range(draw(st.integers(1, 3))):
        ckey = add_cluster(sim, f"c{i}", control_planes=draw(st.integers(0, 3)),
                           workers=draw(st.integers(0, 7)),
                           max_unavailable=draw(max_unavailable))
        nodes = sim.nodes[ckey]
        assert nodes is not None
        for name in sorted(nodes):
            if draw(st.integers(0, 9)) == 0:
                nodes[name] = dataclasses.replace(nodes[name], ready=False)
            elif draw(st.integers(0, 12)) == 0:
                nodes[name] = dataclasses.replace(nodes[name], unschedulable=True)
        bump(sim, ckey, V2, control_plane=draw(st.booleans()), workers=draw(st.booleans()))
    cfg = PlannerSettings(
        deadlines={PENDING: timedelta(seconds=draw(st.integers(5, 60)))},
        default_deadline=timedelta(seconds=draw(st.integers(10, 120))),
        halt_at_failures=draw(st.integers(1, 3)))
    return sim, cfg


EVENTS = ["plan", "plan", "plan", "crash", "node", "node", "node", "fail", "ready", "time",
          "retry", "delete", "bump"]


def _nodes(sim: SimFleet) -> list[tuple[ClusterKey, str]]:
    return [(c, n) for c, ns in sorted(sim.nodes.items()) for n in sorted(ns or {})]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.data())
def test_random_fleets_and_event_orders(fleet: tuple[SimFleet, PlannerSettings],
                                        data: st.DataObject) -> None:
    sim, cfg = fleet
    for _ in range(data.draw(st.integers(10, 80), label="steps")):
        event = data.draw(st.sampled_from(EVENTS), label="event")
        if event == "plan":
            run_pass(sim, cfg)
        elif event == "crash":
            run_pass(sim, cfg, crash_after=data.draw(st.integers(0, 6), label="prefix"))
        elif event in ("node", "fail") and (active := sim.active_requests()):
            ckey, name = data.draw(st.sampled_from(active), label="node")
            fail = data.draw(st.sampled_from([SignalState.FAILED_DOWNLOAD,
                                              SignalState.ROLLED_BACK])) if event == "fail" \
                else None
            sim.step_node(ckey, name, fail=fail)
        elif event == "ready" and (all_nodes := _nodes(sim)):
            ckey, name = data.draw(st.sampled_from(all_nodes), label="toggle")
            nodes = sim.nodes[ckey]
            assert nodes is not None
            nodes[name] = dataclasses.replace(nodes[name], ready=not nodes[name].ready)
        elif event == "time":
            sim.advance(data.draw(st.sampled_from([1, 10, 61, 200]), label="seconds"))
        elif event == "retry" and sim.deployments:
            key = data.draw(st.sampled_from(sorted(sim.deployments)), label="md")
            sim.annotate(KIND_MD, key, ANN_RETRY, str(sim.now.timestamp()))
        elif event == "delete" and (plans := sorted(k for k, p in sim.nodeplans.items()
                                                   if not p.deleting)):
            sim.delete_plan(data.draw(st.sampled_from(plans), label="delete"))
        elif event == "bump" and sim.clusters:
            ckey = data.draw(st.sampled_from(sorted(sim.clusters)), label="bump")
            bump(sim, ckey, V3)

    # Heal: nodes Ready, the agent answers everything, operators retry what failed.
    for nodes in sim.nodes.values():
        for name, node in list((nodes or {}).items()):
            nodes[name] = dataclasses.replace(node, ready=True, unschedulable=False,  # type: ignore[index]
                                              cordoned_by=None)
    targets = {k.ref: k.version for k in sim.control_planes.values()} | {
        d.ref: d.version for d in sim.deployments.values()}
    for _ in range(400):
        n = run_pass(sim, cfg)
        active = sim.active_requests()
        for ckey, name in active:
            sim.finish_node(ckey, name)
        retried = 0
        for key, p in sorted(sim.nodeplans.items()):
            if (p.phase == NodePlanPhase.FAILED and ANN_RETRY not in p.annotations
                    and same_version(p.version, targets.get(p.owner_ref))):
                sim.annotate("NodePlan", key, ANN_RETRY, "heal")
                retried += 1
        sim.advance(1)
        if n == 0 and not retried and not active:
            break
    else:
        raise AssertionError("the fleet did not converge")
    blocked = set()
    for md in sim.deployments.values():
        cp_targets = [K0sVersion.parse(k.version) for k in sim.control_planes.values()  # type: ignore[arg-type]
                      if (k.ref.namespace, k.cluster) == (md.ref.namespace, md.cluster)]
        if UnavailabilityBudget.resolve(md.max_unavailable, md.replicas).impossible or any(
                K0sVersion.parse(md.version) > t for t in cp_targets):  # type: ignore[arg-type]
            blocked.add(md.ref)  # maxUnavailable 0, or workers would be newer than the CPs
    for m in sim.machines.values():
        if m.owner in blocked:
            continue
        target = targets[m.owner]  # type: ignore[index]
        assert same_version(m.version, target) or same_version(
            m.running_version_annotation, target), f"{m.ref.name} not upgraded to {target}"


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), max_unavailable, st.integers(0, 3), st.randoms())
def test_worker_rollout_respects_budget_in_any_completion_order(
        workers: int, max_u: int | str, not_ready: int, rnd: object) -> None:
    assert isinstance(rnd, random.Random)
    sim = SimFleet(now=T0)
    ckey = add_cluster(sim, "c", control_planes=0, workers=workers, max_unavailable=max_u)
    nodes = sim.nodes[ckey]
    assert nodes is not None
    for name in sorted(nodes)[:not_ready]:
        nodes[name] = dataclasses.replace(nodes[name], ready=False)
    bump(sim, ckey, V2)
    cfg = PlannerSettings(default_deadline=timedelta(hours=1))
    limit = UnavailabilityBudget.resolve(max_u, workers).limit
    for _ in range(500):
        n = run_pass(sim, cfg)
        active = sim.active_requests()
        if n == 0 and not active:
            break
        if active:
            sim.step_node(*rnd.choice(active))
        sim.advance(1)
    else:
        raise AssertionError("did not settle")
    # recorded on the Machine, or (while the paused sequence waits for a NotReady peer)
    # by its Completed NodePlan (fleet.world.eligibility.as_recorded)
    upgraded = {m.ref.name for m in sim.machines.values() if m.running_version_annotation} | {
        p.machine for p in sim.nodeplans.values() if p.phase == NodePlanPhase.COMPLETED}
    if limit > not_ready:
        # every Ready node is eventually upgraded; NotReady ones are waited for
        assert upgraded == {n for n in nodes if nodes[n].ready}
    else:
        assert not upgraded


def test_a_plan_past_its_pending_deadline_is_not_signalled_then_failed() -> None:
    """Regression (seed 292774678742148780519962217103882747670): a created but unsignalled
    NodePlan whose Pending deadline passed was signalled and marked failed in one pass;
    the node was then busy while no in-flight plan counted it, and a retarget dispatched
    past maxUnavailable."""
    sim = SimFleet(now=T0)
    ckey = add_cluster(sim, "c0", control_planes=0, workers=4, max_unavailable=2)
    bump(sim, ckey, V2, control_plane=False, workers=True)
    cfg = PlannerSettings(deadlines={PENDING: timedelta(seconds=5)},
                          default_deadline=timedelta(seconds=10), halt_at_failures=1)
    for _ in range(3):
        run_pass(sim, cfg)
    sim.delete_plan(("default", "c0-md-1-v1.31.3-k0s.0"))
    for _ in range(3):
        run_pass(sim, cfg)
    sim.advance(10)
    bump(sim, ckey, V3)
    actions = plan(sim.snapshot(), cfg).actions
    assert not [a for a in actions if isinstance(a, SignalNode) and a.node == "c0-md-2"]
    run_pass(sim, cfg)  # the oracle checks maxUnavailable after the pass


def _signals(actions: list[Action]) -> list[str]:
    return [a.node for a in actions if isinstance(a, SignalNode)]


def _unsent_plan(sim: SimFleet, cfg: PlannerSettings, node: str) -> None:
    """Create and start the node's NodePlan, its signal lost (a write that did not land,
    or a NodePlan the UpdateMachine hook created: the controller signals it later)."""
    for _ in range(3):
        for a in plan(sim.snapshot(), cfg).actions:
            if not isinstance(a, SignalNode):
                sim.apply(a)
    [p] = [p for p in sim.nodeplans.values() if p.node == node]
    assert p.started and not _live((sim.nodes[(p.ref.namespace, p.cluster)] or {})[node])


def test_an_unsent_request_waits_while_peers_went_not_ready_since_its_plan() -> None:
    """A worker's NodePlan created within maxUnavailable but not yet on its node is not
    signalled once a peer went NotReady: that would take a second node down (budget 1)."""
    sim = SimFleet(now=T0)
    ckey = add_cluster(sim, "c0", control_planes=0, workers=4, max_unavailable=1)
    bump(sim, ckey, V2)
    cfg = PlannerSettings(deadlines={PENDING: timedelta(seconds=30)},
                          default_deadline=timedelta(seconds=60))
    _unsent_plan(sim, cfg, "c0-md-0")
    nodes = sim.nodes[ckey]
    assert nodes is not None
    nodes["c0-md-3"] = dataclasses.replace(nodes["c0-md-3"], ready=False)
    for _ in range(3):
        actions = plan(sim.snapshot(), cfg).actions
        assert _signals(actions) == []
        sim.apply_all(actions)
    [p] = sim.nodeplans.values()
    assert p.phase == NodePlanPhase.PENDING and "maxUnavailable 1" in p.message, p.message
    # Held by the budget, not by the node: no deadline runs out meanwhile.
    sim.advance(600)
    sim.apply_all(plan(sim.snapshot(), cfg).actions)
    [p] = sim.nodeplans.values()
    assert p.phase == NodePlanPhase.PENDING, p.message
    # The peer is back: the request goes out, and its Pending deadline starts afresh.
    nodes["c0-md-3"] = dataclasses.replace(nodes["c0-md-3"], ready=True)
    actions = plan(sim.snapshot(), cfg).actions
    assert _signals(actions) == ["c0-md-0"]
    sim.apply_all(actions)
    sim.advance(20)
    sim.apply_all(plan(sim.snapshot(), cfg).actions)
    [p] = sim.nodeplans.values()
    assert p.phase == NodePlanPhase.PENDING, p.message


def test_two_unsent_requests_share_what_is_left_of_the_budget() -> None:
    """Budget 2, two NodePlans unsent, one peer NotReady: one request goes out."""
    sim = SimFleet(now=T0)
    ckey = add_cluster(sim, "c0", control_planes=0, workers=5, max_unavailable=2)
    bump(sim, ckey, V2)
    cfg = PlannerSettings(default_deadline=timedelta(seconds=60))
    for _ in range(3):
        for a in plan(sim.snapshot(), cfg).actions:
            if not isinstance(a, SignalNode):
                sim.apply(a)
    assert sorted(p.node for p in sim.nodeplans.values()) == ["c0-md-0", "c0-md-1"]
    nodes = sim.nodes[ckey]
    assert nodes is not None
    nodes["c0-md-4"] = dataclasses.replace(nodes["c0-md-4"], ready=False)
    assert _signals(plan(sim.snapshot(), cfg).actions) == ["c0-md-0"]
    run_pass(sim, cfg)  # the oracle checks what is physically down after each signal


def test_an_unsent_control_plane_request_waits_for_every_other_control_plane() -> None:
    """Quorum: a control plane's request is not sent while another control plane went
    NotReady after its NodePlan was created."""
    sim = SimFleet(now=T0)
    ckey = add_cluster(sim, "c0", control_planes=3, workers=0)
    bump(sim, ckey, V2)
    cfg = PlannerSettings(default_deadline=timedelta(seconds=60))
    _unsent_plan(sim, cfg, "c0-cp-0")
    nodes = sim.nodes[ckey]
    assert nodes is not None
    nodes["c0-cp-2"] = dataclasses.replace(nodes["c0-cp-2"], ready=False)
    actions = plan(sim.snapshot(), cfg).actions
    assert _signals(actions) == []
    sim.apply_all(actions)
    [p] = sim.nodeplans.values()
    assert "c0-cp-2 NotReady" in p.message, p.message
    nodes["c0-cp-2"] = dataclasses.replace(nodes["c0-cp-2"], ready=True)
    assert _signals(plan(sim.snapshot(), cfg).actions) == ["c0-cp-0"]


def test_an_extension_nodeplan_is_held_like_the_controllers() -> None:
    """The UpdateMachine hook creates the NodePlan (source runtime-extension) when Cluster
    API asks; the controller signals it later, under the same rule."""
    sim = SimFleet(now=T0)
    ckey = add_cluster(sim, "c0", control_planes=0, workers=3, max_unavailable=1)
    bump(sim, ckey, V2)
    cfg = PlannerSettings(default_deadline=timedelta(seconds=60))
    _unsent_plan(sim, cfg, "c0-md-0")
    [(key, p)] = sim.nodeplans.items()
    sim.nodeplans[key] = dataclasses.replace(p, source="runtime-extension")
    nodes = sim.nodes[ckey]
    assert nodes is not None
    nodes["c0-md-1"] = dataclasses.replace(nodes["c0-md-1"], unschedulable=True)
    assert _signals(plan(sim.snapshot(), cfg).actions) == []
