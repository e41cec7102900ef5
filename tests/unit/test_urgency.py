"""The order in which a planning pass starts its groups of actions (fleet.planner.actions
``urgency``): a node's request before the writes it depends on, reports last."""

from __future__ import annotations

from datetime import UTC, datetime

from fleet.planner.actions import (
    Action,
    CreateNodePlan,
    PatchMachineVersion,
    RecordEvent,
    ReleasePause,
    RolloutCounts,
    SetRolloutStatus,
    SignalNode,
    StartNodePlan,
    UncordonNode,
    urgency,
)
from fleet.world.executors import Request
from fleet.world.model import Condition, ObjectRef

KCP = ObjectRef("K0sControlPlane", "ns", "c1-cp")
MD = ObjectRef("MachineDeployment", "ns", "c1-md")
PLAN = ObjectRef("NodePlan", "ns", "c1-w0-v1-31-2")
COUNTS = RolloutCounts("v1.31.2+k0s.0", 3, 3, 0, 0, 0, 1, 0, False)


def status(owner: ObjectRef) -> SetRolloutStatus:
    return SetRolloutStatus(owner, (Condition("Ready", "True", "Done"),), COUNTS)


def create(machine: str) -> CreateNodePlan:
    return CreateNodePlan(("ns", "c1"), MD, ObjectRef("Machine", "ns", machine), machine,
                          "worker", "worker", "v1.31.2+k0s.0", "agent")


def test_a_node_request_comes_first_and_reports_last() -> None:
    assert urgency([create("w0")]) == 0
    assert urgency([StartNodePlan(PLAN, 1, datetime(2026, 12, 2, tzinfo=UTC))]) == 0
    assert urgency([PatchMachineVersion(ObjectRef("Machine", "ns", "cp0"), "v1")]) == 1
    assert urgency([UncordonNode(("ns", "c1"), "w0")]) == 1
    assert urgency([status(KCP)]) == 2
    assert urgency([RecordEvent(KCP, "Upgraded", "done")]) == 2


def test_a_group_ranks_by_its_most_urgent_action() -> None:
    # Actions on one object run in order within their group; the group goes as early
    # as its most urgent action asks.
    assert urgency([status(KCP), ReleasePause(KCP, "v1.31.2+k0s.0")]) == 1
    request = Request("p1", datetime(2026, 12, 2, tzinfo=UTC), 1, "v1.31.2+k0s.0",
                      "https://example.test/k0s", "0" * 64, False, False)
    signal = SignalNode(PLAN, ("ns", "c1"), "w0", "worker", "agent", request)
    assert urgency([RecordEvent(KCP, "Upgrading", "w0"), signal]) == 0


def test_a_control_plane_to_worker_pass_sends_the_worker_request_first() -> None:
    # The planner lists a pass's actions owner by owner: the control plane's status and
    # Event, then the worker's NodePlan, then the MachineDeployment's status.
    groups: list[list[Action]] = [[status(KCP)], [RecordEvent(KCP, "Upgraded", "3/3")],
                                  [create("w0")], [status(MD)],
                                  [PatchMachineVersion(ObjectRef("Machine", "ns", "cp2"),
                                                       "v1.31.2+k0s.0")]]
    ordered = sorted(groups, key=urgency)
    assert [type(g[0]).__name__ for g in ordered] == [
        "CreateNodePlan", "PatchMachineVersion", "SetRolloutStatus", "RecordEvent",
        "SetRolloutStatus"]
    assert ordered[2:] == [[status(KCP)], [RecordEvent(KCP, "Upgraded", "3/3")],
                           [status(MD)]]  # stable: the planner's order among equals
