"""Item 1 of issue #12: nodes k0s-fleet never upgraded do not block their cluster.

Nodes here are built the way real clusters publish them: no k0s-fleet annotation, only
the kubelet's version (and, for pure controllers, the ControlNode's status.k0sVersion).
"""

from __future__ import annotations

import dataclasses

from fleet.contract.versions import kubernetes_release
from fleet.planner.conditions import UP_TO_DATE
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import ClusterProgress, NodeState, clusters_from_snapshot
from fleet.world.model import (
    ANN_MACHINE_RUNNING_VERSION,
    KIND_CONTROL_NODE,
    Condition,
    NodeInfo,
    RolloutStatus,
    node_from,
)
from fleet.world.reported import running_version
from tests.helpers.gate import T0, config

V1 = "v1.31.2+k0s.0"
V2 = "v1.31.3+k0s.0"


def test_kubelet_version_parses_as_a_kubernetes_release() -> None:
    assert kubernetes_release("v1.31.3+k0s") == (1, 31, 3)
    assert kubernetes_release("1.30.0") == (1, 30, 0)
    assert kubernetes_release("garbage") is None
    assert kubernetes_release(None) is None


def test_controlnode_reports_its_k0s_version() -> None:
    cn = node_from({"kind": KIND_CONTROL_NODE, "metadata": {"name": "c0"},
                    "status": {"k0sVersion": V2}})
    assert cn.k0s_version == V2
    node = node_from({"kind": "Node", "metadata": {"name": "n0"},
                      "status": {"k0sVersion": V2}})
    assert node.k0s_version is None  # only ControlNodes carry it


def test_cluster_created_at_the_target_is_complete_without_annotations() -> None:
    sim = SimFleet(now=T0)
    key = add_cluster(sim, "fresh", namespace="fleet", control_planes=1, workers=3, version=V2)
    # The simulated fleet builds Nodes as real clusters publish them.
    assert all(n.running_version is None and n.kubelet_version == "v1.31.3+k0s"
               for n in sim.nodes[key].values())
    [progress] = clusters_from_snapshot(sim.snapshot())
    assert progress.complete, [n for o in progress.objects for n in o.nodes]
    decision = RolloutGate(config()).evaluate(FleetView([progress]), T0)
    assert decision.clusters[key].phase.value == "Complete"


def test_scaled_up_worker_at_the_target_does_not_block_the_cluster() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c", namespace="fleet", control_planes=1, workers=2, version=V1)
    bump(sim, ("fleet", "c"), V2)
    # k0s-fleet upgraded the two old nodes (its agent reported, its Machine record).
    for name in ("c-cp-0", "c-md-0", "c-md-1"):
        sim.nodes[("fleet", "c")][name] = NodeInfo(name, running_version=V2)
    cp = sim.machines[("fleet", "c-cp-0")]
    sim.machines[("fleet", "c-cp-0")] = dataclasses.replace(cp, version=V2)
    for name in ("c-md-0", "c-md-1"):
        w = sim.machines[("fleet", name)]
        sim.machines[("fleet", name)] = dataclasses.replace(
            w, annotations={**w.annotations, ANN_MACHINE_RUNNING_VERSION: V2})
    # An MD scale-up: CAPI creates a Machine at the target; its Node reports the kubelet.
    old = sim.machines[("fleet", "c-md-1")]
    sim.machines[("fleet", "c-md-2")] = dataclasses.replace(
        old, ref=dataclasses.replace(old.ref, name="c-md-2"), node_name="c-md-2", version=V2)
    sim.nodes[("fleet", "c")]["c-md-2"] = NodeInfo("c-md-2", kubelet_version="v1.31.3+k0s")
    md = sim.deployments[("fleet", "c-md")]
    sim.deployments[("fleet", "c-md")] = dataclasses.replace(md, replicas=3)
    [progress] = clusters_from_snapshot(sim.snapshot())
    states = {n.node: n.state for o in progress.objects for n in o.nodes}
    assert states["c-md-2"] is NodeState.UP_TO_DATE
    assert progress.complete


def test_kubelet_contradicting_the_machine_is_not_on_target() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c", namespace="fleet", control_planes=0, workers=1, version=V2)
    m = sim.machines[("fleet", "c-md-0")]
    # The Machine says V2 but the kubelet still runs 1.31.2: not done.
    node = NodeInfo("c-md-0", kubelet_version="v1.31.2+k0s")
    assert running_version(m, node) == "v1.31.2+k0s"
    sim.nodes[("fleet", "c")]["c-md-0"] = node
    [progress] = clusters_from_snapshot(sim.snapshot())
    assert not progress.complete


def test_exact_reports_win_and_pure_controllers_use_their_controlnode() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c", namespace="fleet", control_planes=1, workers=1, version=V1)
    cp, w = sim.machines[("fleet", "c-cp-0")], sim.machines[("fleet", "c-md-0")]
    assert running_version(w, NodeInfo("c-md-0", running_version=V2,
                                       kubelet_version="v1.31.3+k0s")) == V2
    cn = NodeInfo("c-cp-0", kind=KIND_CONTROL_NODE, k0s_version=V2)
    assert running_version(cp, cn) == V2
    assert running_version(w, NodeInfo("c-md-0")) is None  # a worker that reports nothing


def test_another_replicas_never_upgraded_cluster_counts_as_its_holder_wrote() -> None:
    """Sharding: a cluster another replica holds is judged without its Nodes. A cluster
    created at the target has no k0s-fleet record on its worker Machines; the count its
    holder wrote into the MD/KCP (K0sFleetUpToDate summary; Cluster API's CRDs prune
    status.k0sFleet) decides, so the judgement does not change when the cluster changes
    hands. A NodePlan of the target still decides its node."""
    sim = SimFleet(now=T0)
    key = add_cluster(sim, "fresh", namespace="fleet", control_planes=1, workers=3, version=V2)
    [observed] = clusters_from_snapshot(sim.snapshot())
    assert observed.complete and observed.nodes_done == 4

    def foreign() -> ClusterProgress:
        # as a replica holding other clusters sees it: no Nodes of it, only its objects
        snap = sim.snapshot()
        [p] = clusters_from_snapshot(dataclasses.replace(
            snap, foreign=frozenset({key}),
            nodes={k: v for k, v in snap.nodes.items() if k != key}))
        return p

    assert foreign().nodes_done < 4  # the Machines alone: the workers have no record
    for k, md in list(sim.deployments.items()):
        sim.deployments[k] = dataclasses.replace(md, status=RolloutStatus(conditions=(
            Condition(UP_TO_DATE, "True", "UpToDate", f"3/3 machines on {V2}"),)))
    for k, kcp in list(sim.control_planes.items()):
        sim.control_planes[k] = dataclasses.replace(kcp, status=RolloutStatus(conditions=(
            Condition(UP_TO_DATE, "True", "UpToDate", f"1/1 machines on {V2}"),)))
    held = foreign()
    assert held.complete and held.nodes_done == observed.nodes_done == 4
    # a summary for another version says nothing about this target
    for k, md in list(sim.deployments.items()):
        sim.deployments[k] = dataclasses.replace(md, status=RolloutStatus(conditions=(
            Condition(UP_TO_DATE, "True", "UpToDate", f"3/3 machines on {V1}"),)))
    assert not foreign().complete
