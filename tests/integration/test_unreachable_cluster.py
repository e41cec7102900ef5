"""A workload API server that stops answering (issue #12 item 2), and one whose
ControlNode watch alone keeps failing (item 3 of what remained), on real servers.

The controller watches a cluster whose kube-apiserver is stopped mid-rollout (its own
server on the shared etcd, so no other test is disturbed): after the bound it is marked
unreachable (the NodePlan in flight keeps its state and says since when, the
MachineDeployment's Progressing condition says ClusterUnreachable, no other node is
started there), and when the server answers again everything resumes by itself.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from fleet.kube import KubeClient
from fleet.kube.resources import MACHINE_DEPLOYMENTS, NAMESPACES, NODE_PLANS, SERVICE_ACCOUNTS
from fleet.planner import conditions as C
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd
from fleet.testing.world import TEST_CRDS, World, crd_documents, install_crds
from tests.helpers.charts import CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, RBAC
from tests.helpers.controller import V2, fleet_config, running_controller, tuning
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio


async def _wait(pred: Any, timeout: float, what: str) -> Any:
    with anyio.fail_after(timeout):
        while True:
            got = await pred()
            if got:
                return got
            await anyio.sleep(0.2)
    raise AssertionError(what)  # pragma: no cover - fail_after raises first


async def test_stopped_workload_server_is_marked_unreachable_and_resumes(
        mgmt: KubeClient, crds_installed: World, namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    server = await anyio.to_thread.run_sync(crds_installed.add_server, unique("down"))
    try:
        async with await server.client() as wl:
            name = unique("un")
            fc = await create_cluster(mgmt, wl, server.kubeconfig(), namespace=namespace,
                                      name=name, control_planes=0, workers=3,
                                      max_unavailable=1)
            # Deadlines long enough that only the outage can explain a message.
            config = fleet_config(namespace, progressDeadlines={"pending": "10m"})
            async with running_controller(mgmt, config,
                                          tuning=tuning(unreachable_after=3)) as controller:
                await bump(mgmt, fc, V2)
                # Nobody answers on the node: one NodePlan is created and signalled.

                async def one_signalled() -> list[dict[str, Any]]:
                    plans = (await mgmt.list(NODE_PLANS, namespace)).items
                    return [p for p in plans if "signalled" in
                            ((p.get("status") or {}).get("message") or "")]
                [signalled] = await _wait(one_signalled, 60, "a NodePlan signalled")
                await anyio.to_thread.run_sync(server.stop)

                async def plan_says_unreachable() -> bool:
                    p = await mgmt.get(NODE_PLANS, signalled["metadata"]["name"], namespace)
                    return "unreachable since" in (p.get("status") or {}).get("message", "")
                await _wait(plan_says_unreachable, 60, "NodePlan says unreachable since")
                key = (namespace, name)
                assert controller.registry.unreachable(key) is not None

                async def md_condition() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md or "", namespace)
                    return any(c.get("type") == C.PROGRESSING
                               and c.get("reason") == C.R_CLUSTER_UNREACHABLE
                               for c in (md.get("status") or {}).get("conditions") or [])
                await _wait(md_condition, 60, "MD condition ClusterUnreachable")
                plans = (await mgmt.list(NODE_PLANS, namespace)).items
                assert len(plans) == 1  # nothing new started there
                assert plans[0]["status"]["phase"] != "Failed"

                await anyio.to_thread.run_sync(server.start)

                async def resumed() -> bool:
                    p = await mgmt.get(NODE_PLANS, signalled["metadata"]["name"], namespace)
                    msg = (p.get("status") or {}).get("message", "")
                    return controller.registry.unreachable(key) is None and \
                        "unreachable" not in msg
                await _wait(resumed, 90, "cluster reachable again, NodePlan message back")
                await _wait(lambda: _not(md_condition), 60, "MD condition back")
    finally:
        await anyio.to_thread.run_sync(server.stop)


async def _not(pred: Any) -> bool:
    return not await pred()


def _fleet_rules(*, control_nodes: bool) -> list[dict[str, Any]]:
    """What the controller needs in a workload cluster (with or without ControlNodes)."""
    autopilot = ["plans"] + (["controlnodes"] if control_nodes else [])
    return [{"apiGroups": [""], "resources": ["nodes"],
             "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": ["autopilot.k0sproject.io"], "resources": autopilot,
             "verbs": ["get", "list", "watch", "patch", "update"]}]


async def test_failing_control_node_watch_alone_makes_the_cluster_unreachable(
        mgmt: KubeClient, crds_installed: World, namespace: str) -> None:
    """The Node watch answers all along; the ControlNode watch is refused (its RBAC
    revoked in the workload cluster): after the bound the cluster is unreachable, naming
    that watch, nothing new starts there; it resumes by itself once the watch answers."""
    await ensure_infra_crd(mgmt)
    server = await anyio.to_thread.run_sync(crds_installed.add_server, unique("cnw"))
    try:
        async with await server.client() as wl:
            await install_crds(wl, [d for d in crd_documents(TEST_CRDS)
                                    if d["spec"]["names"]["kind"] == "ControlNode"])
            sa_ns, role = unique("fleet-sa"), unique("fleet-workload")
            await wl.create(NAMESPACES, {"metadata": {"name": sa_ns}})
            await wl.create(SERVICE_ACCOUNTS, {"metadata": {"name": "fleet"}}, sa_ns)
            await wl.create(CLUSTER_ROLES, {"metadata": {"name": role},
                                            "rules": _fleet_rules(control_nodes=True)})
            await wl.create(CLUSTER_ROLE_BINDINGS, {
                "metadata": {"name": role},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "fleet", "namespace": sa_ns}]})
            token = (await wl.create_subresource(SERVICE_ACCOUNTS, "fleet", "token", {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": ["https://kubernetes.default.svc"]}}, sa_ns)
            )["status"]["token"]
            name = unique("cn")
            fc = await create_cluster(mgmt, wl, server.kubeconfig(token=token, user="fleet"),
                                      namespace=namespace, name=name, control_planes=0,
                                      workers=2, max_unavailable=1)
            config = fleet_config(namespace, progressDeadlines={"pending": "10m"})
            key = (namespace, name)
            async with running_controller(mgmt, config,
                                          tuning=tuning(unreachable_after=3)) as controller:
                async def watching() -> bool:
                    wc = controller.registry.get(key)
                    return wc is not None and wc.observed and wc.control_nodes.synced
                await _wait(watching, 60, "Node and ControlNode watches running")
                await wl.patch(CLUSTER_ROLES, role, {"rules": _fleet_rules(control_nodes=False)})

                async def down() -> Any:
                    return controller.registry.unreachable(key)
                # The open watch runs to its timeout (30 s here) before the refusal shows.
                _since, error = await _wait(down, 120, "cluster unreachable")
                assert error.startswith("ControlNode watch: ") and "forbidden" in error.lower()
                wc = controller.registry.get(key)
                assert wc is not None and wc.node_reflector is not None
                assert wc.node_reflector.failing_since is None  # Nodes answered all along

                await bump(mgmt, fc, V2)

                async def md_condition() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md or "", namespace)
                    return any(c.get("type") == C.PROGRESSING
                               and c.get("reason") == C.R_CLUSTER_UNREACHABLE
                               and "ControlNode watch" in c.get("message", "")
                               for c in (md.get("status") or {}).get("conditions") or [])
                await _wait(md_condition, 60, "MD condition ClusterUnreachable")
                assert (await mgmt.list(NODE_PLANS, namespace)).items == []

                await wl.patch(CLUSTER_ROLES, role, {"rules": _fleet_rules(control_nodes=True)})

                async def resumed() -> list[Any]:
                    if controller.registry.unreachable(key) is not None:
                        return []
                    return (await mgmt.list(NODE_PLANS, namespace)).items
                [started] = await _wait(resumed, 90, "reachable again, one node started")
                assert started["spec"]["clusterName"] == name
    finally:
        await anyio.to_thread.run_sync(server.stop)
