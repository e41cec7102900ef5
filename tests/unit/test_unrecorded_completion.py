"""Found by the real-world chaos suite (seed 0, `--small`): a NodePlan deleted after its
node finished but before the controller recorded the completion on the Machine.

The node then runs the target and the rollout gate counted the cluster complete (so it
held it: "up to date"), while the planner still wanted that Machine upgraded (a worker's
version is recorded by an annotation, a control plane's by the Machine's spec.version):
the MachineDeployment read "1/2 machines on v1.31.3+k0s.0; held: up to date" for good.
Both must agree: a node without its record is still to do (it is upgraded again and the
completion recorded), so its cluster is not complete.
"""

from __future__ import annotations

from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import CreateNodePlan
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import NodeState, clusters_from_snapshot
from fleet.world.model import NodeInfo
from tests.helpers.gate import T0, config

V1 = "v1.31.2+k0s.0"
V2 = "v1.31.3+k0s.0"
KEY = ("fleet", "c")


def _fleet_done_without_records() -> SimFleet:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c", namespace="fleet", control_planes=1, workers=2, version=V1)
    bump(sim, KEY, V2)
    # Every node finished (its agent reports the target); no NodePlan is left and no
    # completion was recorded on any Machine.
    for name in ("c-cp-0", "c-md-0", "c-md-1"):
        sim.nodes[KEY][name] = NodeInfo(name, running_version=V2,
                                        kubelet_version="v1.31.3+k0s")
    assert not sim.nodeplans
    return sim


def test_gate_and_planner_agree_on_a_completion_never_recorded() -> None:
    sim = _fleet_done_without_records()
    [progress] = clusters_from_snapshot(sim.snapshot())
    states = {n.node: n.state for o in progress.objects for n in o.nodes}
    assert set(states.values()) == {NodeState.WAITING}
    decision = RolloutGate(config()).evaluate(FleetView([progress]), T0)
    assert decision.clusters[KEY].phase.value != "Complete"
    result = plan(sim.snapshot(), PlannerSettings(), hold=decision.hold)
    created = [a.machine.name for a in result.actions if isinstance(a, CreateNodePlan)]
    assert created == ["c-cp-0"]  # done again and recorded: control planes first


def test_the_rollout_finishes_after_the_control_plane_is_recorded() -> None:
    sim = _fleet_done_without_records()
    settings = PlannerSettings()
    for _ in range(40):
        [progress] = clusters_from_snapshot(sim.snapshot())
        if progress.complete:
            break
        decision = RolloutGate(config()).evaluate(FleetView([progress]), sim.now)
        sim.apply_all(plan(sim.snapshot(), settings, hold=decision.hold).actions)
        for ckey, node in sim.active_requests():
            sim.step_node(ckey, node)
        sim.advance(1)
    else:
        raise AssertionError(f"never complete: {progress}")
    assert sim.machines[("fleet", "c-cp-0")].version == V2
    # The workers' records are their Completed NodePlans until the paused sequence ends,
    # which writes each Machine's spec.version with the record.
    for _ in range(20):
        decision = RolloutGate(config()).evaluate(
            FleetView(clusters_from_snapshot(sim.snapshot())), sim.now)
        actions = plan(sim.snapshot(), settings, hold=decision.hold).actions
        if not actions:
            break
        sim.apply_all(actions)
        sim.advance(1)
    for w in ("c-md-0", "c-md-1"):
        assert sim.machines[("fleet", w)].running_version_annotation == V2
        assert sim.machines[("fleet", w)].version == V2
