"""The node agent's drain policy on a real kube-apiserver (issue 31, drain): Cluster API's
``cluster.x-k8s.io/drain: skip`` pod label, and pods without a controller or with emptyDir
data refusing the drain (as ``kubectl drain``) unless the request's node policy allows it.

Each test runs a simulated node (fleet.testing.simnode): a Node in wl1, a fake k0s under a
supervisor, and the agent as a real subprocess.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleet.agents.files import sha256_file
from fleet.kube import KubeClient
from fleet.kube.resources import NAMESPACES, PODS
from fleet.signal import NodePolicy, SignalState
from fleet.testing.releases import ReleaseServer
from tests.helpers.agent import NEW, OLD, TERMINAL, uncordoned
from tests.helpers.names import unique
from tests.helpers.pods import controlled

pytestmark = pytest.mark.anyio


@pytest.fixture
async def ns(wl1: KubeClient) -> AsyncIterator[str]:
    name = unique("drainpol")
    await wl1.create(NAMESPACES, {"metadata": {"name": name}})
    yield name


async def place(client: KubeClient, ns: str, node: str, name: str, *,
                owned: bool = True, labels: dict[str, str] | None = None,
                empty_dir: bool = False) -> None:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owned:
        meta["ownerReferences"] = controlled()
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    await client.create(PODS, {"metadata": meta, "spec": spec}, ns)
    # what a kubelet would report
    await client.patch(PODS, name, {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, ns,
        subresource="status")


async def on_node(client: KubeClient, node: str) -> set[str]:
    pods = await client.list(PODS, field_selector=f"spec.nodeName={node}")
    return {p["metadata"]["name"] for p in pods.items
            if not p["metadata"].get("deletionTimestamp")}


async def test_capi_skip_label_pod_is_left_running(
        sim: Any, releases: ReleaseServer, wl1: KubeClient, ns: str) -> None:
    """A pod labelled cluster.x-k8s.io/drain: skip stays, and so does one the request's
    skipPods selects; their neighbour is evicted and the upgrade completes. Before: all
    were evicted."""
    async with sim() as node:
        await place(wl1, ns, node.name, "keep", labels={"cluster.x-k8s.io/drain": "skip"})
        await place(wl1, ns, node.name, "db", labels={"app": "db"})
        await place(wl1, ns, node.name, "web", labels={"app": "web"})
        plan = await node.request(releases.releases[NEW], policy=NodePolicy.model_validate(
            {"skipPods": [{"matchLabels": {"app": "db"}}]}))
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, sig.status.reason
        assert await on_node(wl1, node.name) == {"keep", "db"}
        applying = [t for t in node.history if t.plan_id == plan
                    and t.state == "ApplyingUpdate"]
        assert "cluster.x-k8s.io/drain: skip" in applying[0].reason
        await node.wait_until(uncordoned)


async def test_unmanaged_and_emptydir_pods_refuse_the_drain_unless_allowed(
        sim: Any, releases: ReleaseServer, wl1: KubeClient, ns: str) -> None:
    """A pod without a controller and a pod with emptyDir data: the drain fails naming
    both, nothing is evicted (not even the managed neighbour), nothing is installed and
    the node is uncordoned. The same node with a request whose policy allows both
    (force, deleteEmptyDirData) drains and upgrades. Before: all three were evicted
    without asking and the first request completed."""
    async with sim() as node:
        await place(wl1, ns, node.name, "bare", owned=False)
        await place(wl1, ns, node.name, "cache", empty_dir=True)
        await place(wl1, ns, node.name, "web")
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None
        assert sig.status.status is SignalState.FAILED_DRAIN, sig.status.reason
        reason = sig.status.reason
        assert reason.startswith("drain refused"), reason
        assert f"{ns}/bare: no controller" in reason, reason
        assert f"{ns}/cache: emptyDir data would be lost (scratch" in reason, reason
        assert f"{ns}/web" not in reason
        assert await on_node(wl1, node.name) == {"bare", "cache", "web"}
        assert sha256_file(node.binary) == releases.releases[OLD].sha256
        assert node.restarts == 0
        await node.wait_until(uncordoned)

        # only one of the two consents: still refused, naming the other pod only
        plan = await node.request(releases.releases[NEW], policy=NodePolicy(force=True))
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None
        assert sig.status.status is SignalState.FAILED_DRAIN, sig.status.reason
        assert f"{ns}/cache" in sig.status.reason and f"{ns}/bare" not in sig.status.reason
        assert await on_node(wl1, node.name) == {"bare", "cache", "web"}
        await node.wait_until(uncordoned)

        plan = await node.request(releases.releases[NEW], policy=NodePolicy(
            force=True, deleteEmptyDirData=True))
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, sig.status.reason
        assert await on_node(wl1, node.name) == set()
        assert await node.running_version() == NEW
        await node.wait_until(uncordoned)
