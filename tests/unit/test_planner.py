"""Planner rules, example by example (no server: the in-memory SimFleet plays the world)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta

import pytest

from fleet.contract.nodeplan import NodePlanPhase, nodeplan_name
from fleet.contract.signal import SignalState, SignalStatus, parse_autopilot_signal
from fleet.planner import PENDING, PlannerSettings, plan
from fleet.planner import conditions as C
from fleet.planner.actions import (
    Action,
    AnnotateWorkerVersion,
    ClearSignal,
    CreateNodePlan,
    HaltObject,
    MarkNodePlanFailed,
    PatchMachineVersion,
    ReleaseNodePlan,
    RemoveAnnotation,
    ReportNotInPlace,
    RetryNodePlan,
    SetRolloutStatus,
    SignalNode,
    StartNodePlan,
    UncordonNode,
    UpdateNodePlanStatus,
)
from fleet.planner.simulate import SimFleet, bump
from fleet.world.executors import request_for
from fleet.world.model import (
    ANN_CAPI_PAUSED,
    ANN_PAUSED_FOR,
    ANN_RETRY,
    KIND_KCP,
    KIND_MD,
    KIND_NODEPLAN,
    ClusterKey,
    MachineDeploymentInfo,
    NodeInfo,
    NodePlanInfo,
    format_time,
)
from tests.helpers.planner import SETTINGS, T0, V1, V2, fleet, of, step


def creates(actions: list[Action]) -> list[str]:
    return [a.machine.name for a in of(actions, CreateNodePlan)]




def settle(sim: SimFleet, settings: PlannerSettings = SETTINGS) -> None:
    """Plan until nothing changes (nodes do not move)."""
    for _ in range(20):
        if not [a for a in plan(sim.snapshot(), settings).actions]:
            return
        step(sim, settings)
    raise AssertionError("planner does not settle")


def run_to_completion(sim: SimFleet, *, max_steps: int = 500) -> list[str]:
    order: list[str] = []
    for _ in range(max_steps):
        actions = step(sim)
        order += creates(actions)
        for ckey, name in sim.active_requests():
            sim.step_node(ckey, name)
        sim.advance(1)
        if not actions and not sim.active_requests() and all(
                p.terminal for p in sim.nodeplans.values()):
            return order
    raise AssertionError("rollout did not finish")


def md_of(sim: SimFleet) -> MachineDeploymentInfo:
    return next(iter(sim.deployments.values()))


def cond(sim: SimFleet, kind: str, ctype: str) -> tuple[str, str, str]:
    obj = md_of(sim) if kind == KIND_MD else next(iter(sim.control_planes.values()))
    c = obj.status.condition(ctype)
    assert c is not None
    return (c.status, c.reason, c.message)


class TestWorkers:
    def test_int_max_unavailable_dispatches_oldest_first(self) -> None:
        sim, ck = fleet(control_planes=0, workers=6, max_unavailable=2)
        bump(sim, ck, V2)
        actions = step(sim)
        assert creates(actions) == ["c1-md-0", "c1-md-1"]
        assert not creates(step(sim))  # budget used: nothing more, however often we plan
        assert not creates(step(sim))

    @pytest.mark.parametrize(("pct", "n"), [("50%", 3), ("34%", 2), ("10%", 0)])
    def test_percent_max_unavailable(self, pct: str, n: int) -> None:
        sim, ck = fleet(control_planes=0, workers=6, max_unavailable=pct)
        bump(sim, ck, V2)
        assert len(creates(step(sim))) == n

    def test_full_rollout_in_order(self) -> None:
        sim, ck = fleet(control_planes=0, workers=5, max_unavailable=2)
        bump(sim, ck, V2)
        assert run_to_completion(sim) == [f"c1-md-{i}" for i in range(5)]
        assert cond(sim, KIND_MD, C.UP_TO_DATE)[0] == "True"
        assert md_of(sim).status.counts["summary"] == "5/5"
        assert all(m.running_version_annotation == V2 for m in sim.machines.values())
        # recorded once per worker, with its spec.version at the end of the paused
        # sequence (one Machine write each), never by a separate annotation write
        assert not of(sim.log, AnnotateWorkerVersion)
        recorded = [a.machine.name for a in of(sim.log, PatchMachineVersion)
                    if a.record_running]
        assert sorted(recorded) == [f"c1-md-{i}" for i in range(5)]

    @pytest.mark.parametrize("value", [0, "0%", None, "20%"])
    def test_zero_max_unavailable_is_reported_and_nothing_happens(self, value: object) -> None:
        sim, ck = fleet(control_planes=0, workers=4, max_unavailable=value)
        bump(sim, ck, V2)
        actions = step(sim)
        assert not creates(actions)
        reports = of(actions, ReportNotInPlace)
        assert [r.reason for r in reports] == [C.R_MAX_UNAVAILABLE_ZERO]
        assert cond(sim, KIND_MD, C.IN_PLACE)[:2] == ("False", C.R_MAX_UNAVAILABLE_ZERO)
        assert not of(step(sim), ReportNotInPlace)  # reported once, not on every pass

    def test_invalid_max_unavailable_is_reported(self) -> None:
        sim, ck = fleet(control_planes=0, workers=4, max_unavailable="lots")
        bump(sim, ck, V2)
        actions = step(sim)
        assert not creates(actions)
        assert [r.reason for r in of(actions, ReportNotInPlace)] == [C.R_INVALID_MAX_UNAVAILABLE]

    def test_not_ready_and_cordoned_nodes_use_the_budget(self) -> None:
        sim, ck = fleet(control_planes=0, workers=6, max_unavailable=3)
        nodes = sim.nodes[ck]
        assert nodes is not None
        nodes["c1-md-0"] = dataclasses.replace(nodes["c1-md-0"], ready=False)
        nodes["c1-md-5"] = dataclasses.replace(nodes["c1-md-5"], unschedulable=True)
        bump(sim, ck, V2)
        assert creates(step(sim)) == ["c1-md-1"]

    def test_missing_replicas_use_the_budget(self) -> None:
        sim, ck = fleet(control_planes=0, workers=4, max_unavailable=2)
        key = next(iter(sim.deployments))
        sim.deployments[key] = dataclasses.replace(sim.deployments[key], replicas=5)
        bump(sim, ck, V2)
        assert creates(step(sim)) == ["c1-md-0"]

    def test_budget_exhausted_by_unavailable_nodes_waits_and_says_why(self) -> None:
        sim, ck = fleet(control_planes=0, workers=3, max_unavailable=1)
        nodes = sim.nodes[ck]
        assert nodes is not None
        nodes["c1-md-2"] = dataclasses.replace(nodes["c1-md-2"], ready=False)
        bump(sim, ck, V2)
        assert not creates(step(sim))
        status, reason, message = cond(sim, KIND_MD, C.UP_TO_DATE)
        assert (status, reason) == ("False", C.R_WAITING)
        assert "1 unavailable of maxUnavailable 1" in message

    def test_not_in_place_machines_are_left_alone_and_reported(self) -> None:
        sim, ck = fleet(control_planes=0, workers=3, max_unavailable=3)
        key = next(iter(sim.machine_sets))
        ms = sim.machine_sets[key]
        sim.machine_sets[key] = dataclasses.replace(
            ms, infrastructure=dataclasses.replace(ms.infrastructure, name="old"))  # type: ignore[type-var]
        bump(sim, ck, V2)
        actions = step(sim)
        assert not creates(actions)
        [report] = of(actions, ReportNotInPlace)
        assert report.reason == C.R_NOT_IN_PLACE
        assert "infrastructure template changed" in report.message
        assert "c1-md-0" in report.message
        assert cond(sim, KIND_MD, C.IN_PLACE)[0] == "False"

    def test_workers_wait_for_control_planes(self) -> None:
        sim, ck = fleet(control_planes=3, workers=3, max_unavailable=3)
        bump(sim, ck, V2)
        actions = step(sim)
        assert creates(actions) == ["c1-cp-0"]
        assert "control plane" in cond(sim, KIND_MD, C.UP_TO_DATE)[2]

    def test_workers_never_newer_than_control_planes(self) -> None:
        sim, ck = fleet(control_planes=1, workers=2, max_unavailable=1)
        bump(sim, ck, V2, control_plane=False)
        assert not creates(step(sim))
        assert "newer version" in cond(sim, KIND_MD, C.UP_TO_DATE)[2]

    def test_only_workers_bumped_when_control_planes_are_ahead(self) -> None:
        sim, ck = fleet(control_planes=1, workers=2, max_unavailable=1, version=V1)
        bump(sim, ck, V2)
        run_to_completion(sim)
        bump(sim, ck, V2, control_plane=False)
        assert not creates(step(sim))  # all already there

    def test_unreachable_cluster_dispatches_nothing(self) -> None:
        sim, ck = fleet(control_planes=0, workers=2, max_unavailable=1)
        sim.nodes[ck] = None
        bump(sim, ck, V2)
        assert not creates(step(sim))
        assert "unreachable" in cond(sim, KIND_MD, C.UP_TO_DATE)[2]

    def test_paused_cluster_and_md(self) -> None:
        sim, ck = fleet(control_planes=0, workers=2, max_unavailable=1)
        sim.clusters[ck] = dataclasses.replace(sim.clusters[ck], paused=True)
        bump(sim, ck, V2)
        assert not creates(step(sim))
        sim.clusters[ck] = dataclasses.replace(sim.clusters[ck], paused=False)
        key = next(iter(sim.deployments))
        sim.deployments[key] = dataclasses.replace(sim.deployments[key], paused=True)
        assert not creates(step(sim))

    def test_deterministic(self) -> None:
        sim, ck = fleet(control_planes=3, workers=6, max_unavailable=2)
        bump(sim, ck, V2)
        snap = sim.snapshot()
        assert plan(snap, SETTINGS) == plan(snap, SETTINGS)


class TestControlPlanes:
    def test_one_at_a_time_oldest_first(self) -> None:
        sim, ck = fleet(control_planes=3, workers=0)
        bump(sim, ck, V2)
        assert run_to_completion(sim) == ["c1-cp-0", "c1-cp-1", "c1-cp-2"]
        assert all(m.version == V2 for m in sim.machines.values())
        assert cond(sim, KIND_KCP, C.UP_TO_DATE)[0] == "True"

    def test_waits_for_not_ready_peer(self) -> None:
        sim, ck = fleet(control_planes=3, workers=0)
        nodes = sim.nodes[ck]
        assert nodes is not None
        nodes["c1-cp-2"] = dataclasses.replace(nodes["c1-cp-2"], ready=False)
        bump(sim, ck, V2)
        assert not creates(step(sim))
        assert "c1-cp-2 NotReady" in cond(sim, KIND_KCP, C.UP_TO_DATE)[2]
        nodes["c1-cp-2"] = dataclasses.replace(nodes["c1-cp-2"], ready=True)
        assert creates(step(sim)) == ["c1-cp-0"]

    def test_second_waits_while_first_in_flight(self) -> None:
        sim, ck = fleet(control_planes=3, workers=0)
        bump(sim, ck, V2)
        assert creates(step(sim)) == ["c1-cp-0"]
        for _ in range(4):
            step(sim)
            sim.step_node(ck, "c1-cp-0")
            assert not creates(step(sim))

    def test_pure_controller_via_control_node(self) -> None:
        sim, ck = fleet(control_planes=1, workers=0)
        nodes = sim.nodes[ck]
        assert nodes is not None
        nodes["c1-cp-0"] = dataclasses.replace(nodes["c1-cp-0"], kind="ControlNode")
        bump(sim, ck, V2)
        [create] = of(step(sim), CreateNodePlan)
        assert create.node_kind == "ControlNode"

    def test_failed_control_plane_blocks_the_next(self) -> None:
        sim, ck = fleet(control_planes=3, workers=0)
        bump(sim, ck, V2)
        step(sim)
        settle(sim)  # start + signal
        sim.step_node(ck, "c1-cp-0", fail=SignalState.ROLLED_BACK)
        actions = step(sim)
        assert of(actions, MarkNodePlanFailed)
        for _ in range(3):
            assert not creates(step(sim))


class TestNodePlanLifecycle:
    def _dispatched(self) -> tuple[SimFleet, ClusterKey, tuple[str, str]]:
        sim, ck = fleet(control_planes=0, workers=2, max_unavailable=1)
        bump(sim, ck, V2)
        step(sim)
        return sim, ck, ("default", nodeplan_name("c1-md-0", V2))

    def _answer(self, sim: SimFleet, ck: ClusterKey, state: SignalState,
                node_clock: datetime) -> None:
        """The node reports ``state``, stamped with its own clock."""
        nodes = sim.nodes[ck]
        assert nodes is not None
        n = nodes["c1-md-0"]
        assert n.signal is not None
        nodes["c1-md-0"] = dataclasses.replace(n, signal=n.signal.with_status(
            SignalStatus(status=state, timestamp=node_clock)))

    def test_node_steps_are_written_once_settled_and_dated_by_the_node_clock(self) -> None:
        sim, ck, key = self._dispatched()
        settle(sim)
        skew = timedelta(hours=-1)  # the node's clock is an hour behind ours
        settle_for = SETTINGS.status_settle
        # The first answer is a new phase: written at once, with both clocks' instant.
        self._answer(sim, ck, SignalState.DOWNLOADING, sim.now + skew)
        [w] = of(step(sim), UpdateNodePlanStatus)
        assert (w.phase, w.node_state) == (NodePlanPhase.IN_PROGRESS, "Downloading")
        p = sim.nodeplans[key]
        assert p.phase_since == sim.now and p.node_state_at == sim.now + skew
        began = sim.now
        # A quick step costs no write (the status still says Downloading) ...
        sim.advance(10)
        self._answer(sim, ck, SignalState.CORDONING, began + timedelta(seconds=9) + skew)
        assert not of(step(sim), UpdateNodePlanStatus)
        sim.advance(1)
        self._answer(sim, ck, SignalState.APPLYING_UPDATE, began + timedelta(seconds=11) + skew)
        result = plan(sim.snapshot(), SETTINGS)
        assert not of(result.actions, UpdateNodePlanStatus)
        # ... a step the node stays in is written once it has lasted status_settle, dated
        # by the node's clock read against ours (not an hour ago, not when we saw it).
        assert result.wake_at == began + timedelta(seconds=11) + settle_for
        sim.advance(settle_for.total_seconds())
        [w] = of(step(sim), UpdateNodePlanStatus)
        assert w.node_state == "ApplyingUpdate"
        assert w.phase_since == began + timedelta(seconds=11)
        assert sim.nodeplans[key].node_state == "ApplyingUpdate"
        # Its deadline runs from there: 120 s (the default here) after entering it.
        assert plan(sim.snapshot(), SETTINGS).wake_at == began + timedelta(seconds=131)
        sim.advance((began + timedelta(seconds=131) - sim.now).total_seconds() - 1)
        assert not of(step(sim), MarkNodePlanFailed)
        sim.advance(1)
        [f] = of(step(sim), MarkNodePlanFailed)
        assert f.deadline and "ApplyingUpdate" in f.message

    def test_a_step_dated_ahead_of_our_clock_wakes_at_the_same_time_on_every_pass(
            self) -> None:
        """The node's clock ran faster than ours: by its stamps it entered a step after
        our "now". Its status write and deadline count from that instant on every pass
        (counted from "now", the wake-up moved with each pass, and an incremental
        planner keeping the first pass's wake-up disagreed with a full re-plan)."""
        sim, ck, _ = self._dispatched()
        settle(sim)
        self._answer(sim, ck, SignalState.DOWNLOADING, sim.now)
        assert of(step(sim), UpdateNodePlanStatus)  # a new phase: written at once
        began = sim.now
        sim.advance(1)
        # one second later by our clock, two by the node's
        self._answer(sim, ck, SignalState.CORDONING, began + timedelta(seconds=2))
        first = plan(sim.snapshot(), SETTINGS)
        assert not of(first.actions, UpdateNodePlanStatus)
        assert first.wake_at == began + timedelta(seconds=2) + SETTINGS.status_settle
        sim.advance(1)
        assert plan(sim.snapshot(), SETTINGS).wake_at == first.wake_at
        sim.advance((first.wake_at - sim.now).total_seconds())
        [w] = of(step(sim), UpdateNodePlanStatus)
        assert w.node_state == "Cordoning" and w.phase_since == began + timedelta(seconds=2)

    def test_start_then_signal(self) -> None:
        sim, ck, key = self._dispatched()
        actions = step(sim)
        assert of(actions, StartNodePlan) and not of(actions, SignalNode)
        actions = step(sim)
        [sig] = of(actions, SignalNode)
        p = sim.nodeplans[key]
        r = sig.request
        assert (r.plan_id, r.created, r.version) == (p.plan_id, p.started_at, V2)
        node = sim.nodes[ck]["c1-md-0"]  # type: ignore[index]
        assert node.signal is not None and node.signal.planId == p.plan_id

    def test_mirrors_node_state(self) -> None:
        sim, ck, key = self._dispatched()
        settle(sim)
        sim.step_node(ck, "c1-md-0")
        [upd] = of(step(sim), UpdateNodePlanStatus)
        assert (upd.phase, upd.node_state) == (NodePlanPhase.IN_PROGRESS, "Downloading")
        assert sim.nodeplans[key].phase_since == T0

    def test_completion_needs_ready_and_version(self) -> None:
        sim, ck, key = self._dispatched()
        settle(sim)
        sim.finish_node(ck, "c1-md-0")
        nodes = sim.nodes[ck]
        assert nodes is not None
        nodes["c1-md-0"] = dataclasses.replace(nodes["c1-md-0"], ready=False)
        actions = step(sim)
        assert not of(actions, AnnotateWorkerVersion)
        assert sim.nodeplans[key].phase == NodePlanPhase.IN_PROGRESS
        assert "Ready" in sim.nodeplans[key].message
        nodes["c1-md-0"] = dataclasses.replace(nodes["c1-md-0"], ready=True,
                                               running_version=V1)
        step(sim)
        assert sim.nodeplans[key].phase == NodePlanPhase.IN_PROGRESS
        nodes["c1-md-0"] = dataclasses.replace(nodes["c1-md-0"], running_version=V2)
        actions = step(sim)
        # Its MD is in k0s-fleet's paused sequence for V2: the Completed NodePlan is the
        # record until the sequence ends (no Machine write per completion).
        assert not of(actions, AnnotateWorkerVersion)
        # The next node starts once the Completed status is recorded (the next pass), so
        # the NodePlans never show more in flight than maxUnavailable.
        assert creates(actions) == []
        assert sim.nodeplans[key].phase == NodePlanPhase.COMPLETED
        assert creates(step(sim)) == ["c1-md-1"]
        assert md_of(sim).status.counts["updated"] == 1  # counted from its NodePlan

    def test_control_plane_completion_patches_machine_version(self) -> None:
        sim, ck = fleet(control_planes=1, workers=0)
        bump(sim, ck, V2)
        settle(sim)
        sim.finish_node(ck, "c1-cp-0")
        assert [a.version for a in of(step(sim), PatchMachineVersion)] == [V2]

    def test_silent_node_hits_the_pending_deadline_then_halts(self) -> None:
        sim, _ck, _key = self._dispatched()
        settle(sim)
        # "signalled; waiting for the node to answer" is written once that has lasted
        # status_settle (a node that answers at once costs no such write) ...
        assert plan(sim.snapshot(), SETTINGS).wake_at == T0 + SETTINGS.status_settle
        assert "waiting for the node" not in sim.nodeplans[_key].message
        sim.advance(SETTINGS.status_settle.total_seconds())
        step(sim)
        assert "waiting for the node to answer" in sim.nodeplans[_key].message
        assert sim.nodeplans[_key].phase_since == T0  # still dated from the start
        # ... and the deadline counts from the start all the same.
        result = plan(sim.snapshot(), SETTINGS)
        assert result.wake_at == T0 + timedelta(seconds=30)
        sim.advance(29 - SETTINGS.status_settle.total_seconds())
        assert not of(step(sim), MarkNodePlanFailed)
        sim.advance(1)
        actions = step(sim)
        [failed] = of(actions, MarkNodePlanFailed)
        assert failed.reason == C.R_DEADLINE and "Pending" in failed.message
        assert not creates(actions)  # the failure uses the budget, and the budget (0) halts
        assert of(actions, HaltObject)
        assert not of(step(sim), HaltObject)  # said once
        assert cond(sim, KIND_MD, C.HALTED)[:2] == ("True", C.R_HALTED)
        assert not creates(step(sim))

    def test_deadline_per_phase(self) -> None:
        sim, ck, _key = self._dispatched()
        settings = dataclasses.replace(SETTINGS, deadlines={
            PENDING: timedelta(seconds=30), "Downloading": timedelta(seconds=5)})
        settle(sim, settings)
        sim.step_node(ck, "c1-md-0")
        step(sim, settings)  # observed Downloading at T0
        sim.advance(5)
        [failed] = of(step(sim, settings), MarkNodePlanFailed)
        assert "Downloading" in failed.message

    def test_progress_restarts_the_deadline(self) -> None:
        sim, ck, _key = self._dispatched()
        settle(sim)
        for _ in range(6):
            sim.advance(25)
            sim.step_node(ck, "c1-md-0")
            assert not of(step(sim), MarkNodePlanFailed)

    def test_node_failure(self) -> None:
        sim, ck, _key = self._dispatched()
        settle(sim)
        sim.step_node(ck, "c1-md-0", fail=SignalState.FAILED_DOWNLOAD)
        [failed] = of(step(sim), MarkNodePlanFailed)
        assert failed.reason == C.R_NODE_FAILED and "FailedDownload" in failed.message

    def test_failure_budget_allows_some_failures(self) -> None:
        sim, ck = fleet(control_planes=0, workers=4, max_unavailable=2)
        bump(sim, ck, V2)
        settings = dataclasses.replace(SETTINGS, halt_at_failures=2)
        step(sim, settings)
        settle(sim, settings)
        sim.step_node(ck, "c1-md-0", fail=SignalState.FAILED_VERIFY)
        settle(sim, settings)
        assert cond(sim, KIND_MD, C.HALTED)[0] == "False"
        sim.step_node(ck, "c1-md-1", fail=SignalState.FAILED_VERIFY)
        settle(sim, settings)
        assert cond(sim, KIND_MD, C.HALTED)[0] == "True"

    def test_retry_annotation_on_owner_resets_failures(self) -> None:
        sim, ck, key = self._dispatched()
        settle(sim)
        sim.step_node(ck, "c1-md-0", fail=SignalState.FAILED_DOWNLOAD)
        settle(sim)
        assert cond(sim, KIND_MD, C.HALTED)[0] == "True"
        sim.annotate(KIND_MD, next(iter(sim.deployments)), ANN_RETRY, "1")
        actions = step(sim)
        [retry] = of(actions, RetryNodePlan)
        assert retry.attempts == 2
        assert of(actions, RemoveAnnotation)
        assert not creates(actions)  # the retried node still holds the one slot
        settle(sim)
        assert cond(sim, KIND_MD, C.HALTED)[0] == "False"
        node = sim.nodes[ck]["c1-md-0"]  # type: ignore[index]
        assert node.signal is not None and node.signal.created == sim.nodeplans[key].started_at
        assert node.signal.status is None  # a fresh request
        sim.finish_node(ck, "c1-md-0")
        assert creates(step(sim)) == []  # its Completed status is recorded first
        assert creates(step(sim)) == ["c1-md-1"]

    def test_retry_annotation_on_plan(self) -> None:
        sim, ck, key = self._dispatched()
        settle(sim)
        sim.step_node(ck, "c1-md-0", fail=SignalState.FAILED_DOWNLOAD)
        settle(sim)
        sim.annotate(KIND_NODEPLAN, key, ANN_RETRY, "x")
        actions = step(sim)
        assert of(actions, RetryNodePlan)
        assert ANN_RETRY not in sim.nodeplans[key].annotations

    def test_retry_annotation_on_a_healthy_plan_is_just_removed(self) -> None:
        sim, _ck, key = self._dispatched()
        settle(sim)
        sim.annotate(KIND_NODEPLAN, key, ANN_RETRY, "x")
        actions = step(sim)
        assert not of(actions, RetryNodePlan) and of(actions, RemoveAnnotation)

    def test_late_completion_after_deadline(self) -> None:
        sim, ck, key = self._dispatched()
        settle(sim)
        sim.advance(31)
        settle(sim)
        assert sim.nodeplans[key].phase == NodePlanPhase.FAILED
        sim.finish_node(ck, "c1-md-0")
        step(sim)
        assert sim.nodeplans[key].phase == NodePlanPhase.COMPLETED

    def test_deleting_a_plan_clears_signal_uncordons_and_releases(self) -> None:
        sim, ck, key = self._dispatched()
        settle(sim)
        sim.step_node(ck, "c1-md-0")
        sim.step_node(ck, "c1-md-0")  # Cordoning: the agent cordoned the node
        node = sim.nodes[ck]["c1-md-0"]  # type: ignore[index]
        assert node.unschedulable and node.cordoned_by
        sim.delete_plan(key)
        assert [type(a) for a in step(sim) if not isinstance(a, SetRolloutStatus)] \
            == [ClearSignal]
        actions = step(sim)
        assert of(actions, UncordonNode)
        assert of(step(sim), ReleaseNodePlan)
        assert key not in sim.nodeplans
        node = sim.nodes[ck]["c1-md-0"]  # type: ignore[index]
        assert not node.unschedulable and node.signal is None
        # The machine is still out of date: dispatched again later (a fresh NodePlan).
        assert "c1-md-0" in run_to_completion(sim)

    def test_orphan_signal_is_cleared(self) -> None:
        sim, _ck, key = self._dispatched()
        settle(sim)
        del sim.nodeplans[key]  # gone without the finalizer (e.g. force-removed)
        assert of(step(sim), ClearSignal)

    def test_busy_node_is_not_overwritten(self) -> None:
        sim, _ck, key = self._dispatched()
        settle(sim)
        other = dataclasses.replace(sim.nodeplans[key], ref=dataclasses.replace(
            sim.nodeplans[key].ref, name="other"), started_at=None, phase=NodePlanPhase.PENDING)
        sim.nodeplans[("default", "other")] = other
        step(sim)  # starts the other plan
        actions = step(sim)
        assert not [s for s in of(actions, SignalNode) if s.plan.name == "other"]
        sim.advance(SETTINGS.status_settle.total_seconds())  # written once it lasts
        assert not [s for s in of(step(sim), SignalNode) if s.plan.name == "other"]
        assert "busy" in sim.nodeplans[("default", "other")].message

    def test_completion_recorded_at_once_outside_the_paused_sequence(self) -> None:
        """The record waits for the end of k0s-fleet's paused sequence only while that
        sequence runs for the plan's version: with the pause gone (released, or removed
        by someone), the completion is written on the Machine at once."""
        sim, ck, key = self._dispatched()
        settle(sim)
        md = md_of(sim)
        sim.deployments[(md.ref.namespace, md.ref.name)] = dataclasses.replace(
            md, annotations={k: v for k, v in md.annotations.items()
                             if k not in (ANN_CAPI_PAUSED, ANN_PAUSED_FOR)})
        sim.finish_node(ck, "c1-md-0")
        actions = step(sim)
        assert sim.nodeplans[key].phase == NodePlanPhase.COMPLETED
        assert [a.machine.name for a in of(actions, AnnotateWorkerVersion)] == ["c1-md-0"]

    def test_version_change_mid_rollout_keeps_in_flight_in_the_budget(self) -> None:
        sim, ck = fleet(control_planes=0, workers=4, max_unavailable=2)
        bump(sim, ck, V2)
        step(sim)
        settle(sim)
        bump(sim, ck, "v1.31.4+k0s.0")
        assert not creates(step(sim))  # the two V2 upgrades still occupy the budget
        sim.finish_node(ck, "c1-md-0")
        actions = step(sim)
        assert of(actions, AnnotateWorkerVersion)  # it runs V2 now
        assert creates(actions) == []  # its Completed status is recorded first
        assert creates(step(sim)) == ["c1-md-0"]  # the oldest machine not on V3

    def test_autopilot_signal_is_understood(self) -> None:
        sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1, executor="autopilot")
        bump(sim, ck, V2)
        step(sim)
        step(sim)  # start
        key = ("default", nodeplan_name("c1-md-0", V2))
        p = sim.nodeplans[key]
        assert p.executor == "autopilot"
        nodes = sim.nodes[ck]
        assert nodes is not None
        for raw, phase in [("Restart", NodePlanPhase.IN_PROGRESS),
                           ("Completed", NodePlanPhase.COMPLETED)]:
            data = {"planId": p.plan_id, "created": format_time(p.started_at),  # type: ignore[arg-type]
                    "command": {"id": 1, "k0supdate": {"version": V2}},
                    "status": {"status": raw, "timestamp": "x"}}
            nodes["c1-md-0"] = NodeInfo(
                "c1-md-0", autopilot_signal=parse_autopilot_signal(json.dumps(data)))
            step(sim)
            assert sim.nodeplans[key].phase == phase
            if raw == "Restart":
                assert sim.nodeplans[key].node_state == "Restarting"


def test_every_action_for_an_empty_world_is_none() -> None:
    assert plan(SimFleet(now=T0).snapshot(), SETTINGS).actions == []


def test_extension_sourced_plans_do_not_touch_machines() -> None:
    sim, ck = fleet(control_planes=1, workers=0)
    bump(sim, ck, V2)
    step(sim)
    key = ("default", nodeplan_name("c1-cp-0", V2))
    sim.nodeplans[key] = dataclasses.replace(sim.nodeplans[key], source="runtime-extension")
    settle(sim)
    sim.finish_node(ck, "c1-cp-0")
    actions = step(sim)
    assert sim.nodeplans[key].phase == NodePlanPhase.COMPLETED
    assert not of(actions, PatchMachineVersion)


def _unused(p: NodePlanInfo) -> None:  # keep type imports honest
    del p


def test_a_request_on_the_node_is_adopted_by_a_plan_not_yet_started() -> None:
    """Signalled, then the status write was lost (controller killed): adopt, never replace."""
    sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1)
    bump(sim, ck, V2)
    step(sim)  # create
    key = ("default", nodeplan_name("c1-md-0", V2))
    p = sim.nodeplans[key]
    sim.apply(SignalNode(plan=p.ref, cluster=ck, node="c1-md-0", node_kind="Node",
                         executor="agent", request=request_for(
                             p, created=T0 - timedelta(seconds=5), attempt=1, traceparent="")))
    nodes = sim.nodes[ck]
    sim.nodes[ck] = None  # the workload cluster is not listed yet
    assert not of(step(sim), StartNodePlan)
    sim.nodes[ck] = nodes
    [start] = of(step(sim), StartNodePlan)
    assert start.started_at == T0 - timedelta(seconds=5)
    assert not of(step(sim), SignalNode)  # the node carries exactly this request


def test_autopilot_completion_needs_the_kubelet_on_the_new_release() -> None:
    sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1, executor="autopilot")
    bump(sim, ck, V2)
    step(sim)
    step(sim)  # start
    key = ("default", nodeplan_name("c1-md-0", V2))
    p = sim.nodeplans[key]
    data = {"planId": p.plan_id, "created": format_time(p.started_at),  # type: ignore[arg-type]
            "command": {"id": 1, "k0supdate": {"version": V2}},
            "status": {"status": "Completed", "timestamp": "x"}}
    nodes = sim.nodes[ck]
    assert nodes is not None
    nodes["c1-md-0"] = NodeInfo("c1-md-0",
                                autopilot_signal=parse_autopilot_signal(json.dumps(data)),
                                running_version=V1, kubelet_version="v1.31.2+k0s")
    step(sim)
    assert sim.nodeplans[key].phase == NodePlanPhase.IN_PROGRESS
    assert "reporting" in sim.nodeplans[key].message
    nodes["c1-md-0"] = dataclasses.replace(nodes["c1-md-0"], kubelet_version="v1.31.3+k0s")
    step(sim)
    assert sim.nodeplans[key].phase == NodePlanPhase.COMPLETED


def test_status_counts_pruned_by_the_crd_do_not_cause_endless_writes() -> None:
    """Cluster API's CRDs prune status.k0sFleet: conditions alone decide a rewrite."""
    sim, ck = fleet(control_planes=0, workers=2, max_unavailable=1)
    bump(sim, ck, V2)
    step(sim)
    key = next(iter(sim.deployments))
    md = sim.deployments[key]
    sim.deployments[key] = dataclasses.replace(md, status=dataclasses.replace(md.status,
                                                                              counts={}))
    assert not [a for a in plan(sim.snapshot(), SETTINGS).actions
                if isinstance(a, SetRolloutStatus)]


def _started_unsent(sim: SimFleet, ck: ClusterKey) -> NodePlanInfo:
    """A worker's NodePlan started (status written) whose request never reached its node:
    the controller was killed between the two writes."""
    step(sim)  # create
    actions = plan(sim.snapshot(), SETTINGS).actions
    sim.apply_all(a for a in actions if not isinstance(a, SignalNode))
    [p] = [p for p in sim.nodeplans.values() if p.started_at is not None]
    assert not sim.active_requests()
    return p


def test_a_request_a_killed_controller_never_sent_is_sent_by_the_next_one() -> None:
    """The next controller starts acting long after the pending deadline: the node was never
    asked, so the plan is not failed for the time no controller acted; it is signalled."""
    sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1)
    bump(sim, ck, V2)
    p = _started_unsent(sim, ck)
    sim.advance(int(SETTINGS.deadline(PENDING).total_seconds()) * 4)
    # no controller acting on the cluster known: the old rule (counted from the start) fails it
    assert of(plan(sim.snapshot(), SETTINGS).actions, MarkNodePlanFailed)
    sim.clusters[ck] = dataclasses.replace(sim.clusters[ck], acting_since=sim.now)
    actions = step(sim)
    assert not of(actions, MarkNodePlanFailed)
    assert [a.plan for a in of(actions, SignalNode)] == [p.ref]


def test_a_silent_node_still_misses_its_pending_deadline_after_a_controller_restart() -> None:
    sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1)
    bump(sim, ck, V2)
    _started_unsent(sim, ck)
    sim.advance(100)
    sim.clusters[ck] = dataclasses.replace(sim.clusters[ck], acting_since=sim.now)
    assert of(step(sim), SignalNode)  # the node never answers
    sim.advance(int(SETTINGS.deadline(PENDING).total_seconds()) - 1)
    assert not of(step(sim), MarkNodePlanFailed)
    sim.advance(2)
    [failed] = of(step(sim), MarkNodePlanFailed)
    assert failed.deadline


def test_an_upgrading_node_of_a_cluster_not_listed_yet_is_left_as_it_stands() -> None:
    """A restarted controller's first pass, before the workload cluster's Nodes are listed:
    the plan in progress is neither failed nor rewritten with an empty node state."""
    sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1)
    bump(sim, ck, V2)
    for _ in range(3):
        step(sim)
    [(_, name)] = sim.active_requests()
    sim.step_node(ck, name)
    step(sim)
    [p] = sim.nodeplans.values()
    assert p.phase == NodePlanPhase.IN_PROGRESS and p.node_state
    sim.nodes[ck] = None
    sim.advance(int(SETTINGS.default_deadline.total_seconds()) * 2)
    sim.clusters[ck] = dataclasses.replace(sim.clusters[ck], acting_since=sim.now)
    assert not [a for a in plan(sim.snapshot(), SETTINGS).actions
                if getattr(a, "plan", None) == p.ref or getattr(a, "ref", None) == p.ref]


def test_a_control_plane_completion_counts_while_its_machine_write_lands() -> None:
    """The pass after a control plane's completion may run before the patch of its
    Machine's spec.version (emitted with the completion, retried every pass until it
    lands) is seen: its Completed NodePlan counts it, so the KCP's status says 1/1 once
    instead of 0/1 and then 1/1 (one status write per control-plane upgrade)."""
    sim, ck = fleet(control_planes=1, workers=0)
    bump(sim, ck, V2)
    key = ("default", nodeplan_name("c1-cp-0", V2))
    for _ in range(20):
        actions = plan(sim.snapshot(), SETTINGS).actions
        sim.apply_all([a for a in actions if not isinstance(a, PatchMachineVersion)])
        if key in sim.nodeplans and sim.nodeplans[key].phase == NodePlanPhase.COMPLETED:
            break
        for ckey, node in sim.active_requests():
            sim.finish_node(ckey, node)
        sim.advance(1)
    else:
        raise AssertionError("the control plane never completed")
    assert sim.machines[("default", "c1-cp-0")].version == V1  # its record not landed yet
    actions = plan(sim.snapshot(), SETTINGS).actions
    assert [a.machine.name for a in of(actions, PatchMachineVersion)] == ["c1-cp-0"]
    [status] = of(actions, SetRolloutStatus)
    assert status.counts.as_status()["summary"] == "1/1"
    assert status.conditions[0].status == "True"  # K0sFleetUpToDate


@pytest.mark.parametrize("landed", ["machine", "nodeplan"])
def test_workers_start_once_the_last_control_plane_is_done_whichever_write_lands_first(
        landed: str) -> None:
    """The last control plane's completion is two writes (its NodePlan's status, its
    Machine's version) that land at different moments. The node is done (it runs the
    target and is Ready): the pass that finds it so lets the workers start, and so does a
    pass that sees only one of the writes. They waited for both to be seen, one more
    round trip or two (the longest completion -> next request gaps at 1000 clusters,
    bench/README.md)."""
    sim, ck = fleet(control_planes=1, workers=2)
    bump(sim, ck, V2)
    key = ("default", nodeplan_name("c1-cp-0", V2))
    for _ in range(20):
        actions = plan(sim.snapshot(), SETTINGS).actions
        if of(actions, UpdateNodePlanStatus) and any(
                a.phase == NodePlanPhase.COMPLETED for a in of(actions, UpdateNodePlanStatus)):
            break
        sim.apply_all(actions)
        for ckey, node in sim.active_requests():
            sim.finish_node(ckey, node)
        sim.advance(1)
    else:
        raise AssertionError("the control plane never completed")
    assert [a.machine.name for a in of(actions, PatchMachineVersion)] == ["c1-cp-0"]
    assert [a.machine.name for a in of(actions, CreateNodePlan)] == ["c1-md-0", "c1-md-1"]
    # One of the completion's writes has landed, the other is still on its way.
    sim.apply_all([a for a in actions if isinstance(
        a, PatchMachineVersion if landed == "machine" else UpdateNodePlanStatus)])
    assert (sim.nodeplans[key].phase == NodePlanPhase.COMPLETED) == (landed == "nodeplan")
    assert (sim.machines[("default", "c1-cp-0")].version == V2) == (landed == "machine")
    actions = plan(sim.snapshot(), SETTINGS).actions
    assert [a.machine.name for a in of(actions, CreateNodePlan)] == ["c1-md-0", "c1-md-1"]
