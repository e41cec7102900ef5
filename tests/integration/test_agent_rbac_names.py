"""RBAC can pin the agent's Node access to its own Node by name, watch included.

kube-apiserver maps a list/watch whose field selector is exactly ``metadata.name=<n>``
to a request for the named object (k8s.io/apiserver requestinfo), so ``resourceNames``
applies to the agent's one watch. A per-node identity (a pure controller's systemd
agent with its own kubeconfig) can therefore be limited to its own Node; a DaemonSet's
shared ServiceAccount cannot name every node, hence the chart's admission policy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleet.contract.signal import HAPPY_PATH, SignalState
from fleet.kube import ForbiddenError, KubeClient
from fleet.kube.resources import NAMESPACES, NODES, SERVICE_ACCOUNTS, Resource
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

RBAC = "rbac.authorization.k8s.io"
CLUSTER_ROLES = Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource(RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding",
                                 namespaced=False)
OLD, NEW = "v1.31.3+k0s.0", "v1.32.1+k0s.0"


async def test_agent_with_node_access_limited_by_resource_names(
        crds_installed: World, wl1: KubeClient, tmp_path: Path) -> None:
    server = crds_installed["wl1"]
    node_name, other = unique("named-node"), unique("other-node")
    ns, name = unique("agent-named"), unique("agent")
    await wl1.create(NAMESPACES, {"metadata": {"name": ns}})
    await wl1.create(SERVICE_ACCOUNTS, {"metadata": {"name": "agent"}}, ns)
    await wl1.create(CLUSTER_ROLES, {"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "resourceNames": [node_name],
         "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]})
    await wl1.create(CLUSTER_ROLE_BINDINGS, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": ns}]})
    await wl1.create(NODES, {"metadata": {"name": other}})
    token = (await wl1.create_subresource(SERVICE_ACCOUNTS, "agent", "token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": ["https://kubernetes.default.svc"]}}, ns))["status"]["token"]
    kubeconfig = tmp_path / "agent.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(server.kubeconfig(token=token, user="agent")))

    async with ReleaseServer() as rs:
        rs.add(OLD)
        new = rs.add(NEW)
        async with SimNode.running(wl1, server.kubeconfig(), tmp_path / "n", rs.releases[OLD],
                                   name=node_name, start_agent=False) as node:
            async with await server.client(token=token) as agent:
                # the watch the agent makes is allowed; anything wider is not
                listed = await agent.list(NODES, field_selector=f"metadata.name={node_name}")
                assert [n["metadata"]["name"] for n in listed.items] == [node_name]
                with pytest.raises(ForbiddenError):
                    await agent.list(NODES)
                with pytest.raises(ForbiddenError):
                    await agent.list(NODES, field_selector=f"metadata.name={other}")
                with pytest.raises(ForbiddenError):
                    await agent.patch(NODES, other, {"metadata": {"labels": {"x": "y"}}})
            await node.start_agent(extra_args=["--kubeconfig", str(kubeconfig)])
            plan = await node.request(new)
            sig = await node.wait_for(plan, {s for s in SignalState if s.terminal}, timeout=60)
            assert sig.status is not None
            assert sig.status.status is SignalState.COMPLETED, sig.status.reason
            assert node.states(plan) == [str(s) for s in HAPPY_PATH]
            assert "Forbidden" not in node.log_text()
