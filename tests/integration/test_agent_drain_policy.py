"""The node agent's drain policy on a real kube-apiserver (issue 31, drain): Cluster API's
``cluster.x-k8s.io/drain: skip`` pod label and its MachineDrainRules (carried in the
request), and pods without a controller or with emptyDir data refusing the drain (as
``kubectl drain``) unless the request's node policy allows it.

Each test runs a simulated node (fleet.testing.simnode): a Node in wl1, a fake k0s under a
supervisor, and the agent as a real subprocess.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from fleet.agents.files import sha256_file
from fleet.contract.signal import NodePolicy, SignalState
from fleet.kube import KubeClient
from fleet.kube.resources import NAMESPACES, PODS
from fleet.kube.watch import watch_once
from fleet.testing.releases import ReleaseServer
from tests.helpers.agent import NEW, OLD, TERMINAL, uncordoned
from tests.helpers.capienv import wait_for
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


async def test_machine_drain_rules_in_the_request_order_skip_and_wait(
        sim: Any, releases: ReleaseServer, wl1: KubeClient, ns: str) -> None:
    """Cluster API's MachineDrainRules as the controller sends them: a Skip rule by the
    namespace's labels keeps `logs`; `web` (no rule) goes first; `job` (WaitCompleted) is
    never evicted and the drain waits for it to complete; `db` (Drain, order 10) is
    evicted only after both of group 0 are gone. Every pod's outcome is in the status.
    Before: every pod but none was evicted at once and the rules were not read."""
    mon = unique("drainmon")
    await wl1.create(NAMESPACES, {"metadata": {"name": mon, "labels": {"team": mon}}})
    rules = [{"name": "a-monitoring", "behavior": "Skip",
              "pods": [{"namespaceSelector": {"matchLabels": {"team": mon}}}]},
             {"name": "b-db-last", "behavior": "Drain", "order": 10,
              "pods": [{"selector": {"matchLabels": {"app": "db"}}}]},
             {"name": "c-jobs", "behavior": "WaitCompleted",
              "pods": [{"selector": {"matchLabels": {"app": "job"}}}]}]
    seen: list[tuple[str, str, bool, str]] = []  # (pod, event, terminating, phase)

    async def record(node: str, *, task_status: Any) -> None:
        listed = await wl1.list(PODS, field_selector=f"spec.nodeName={node}")
        task_status.started()
        async for ev in watch_once(wl1, PODS, listed.resource_version,
                                   field_selector=f"spec.nodeName={node}",
                                   timeout_seconds=120):
            if isinstance(ev, str):
                continue
            meta = ev.object["metadata"]
            seen.append((meta["name"], ev.type, bool(meta.get("deletionTimestamp")),
                         (ev.object.get("status") or {}).get("phase") or ""))

    async with sim() as node, anyio.create_task_group() as tg:
        await place(wl1, mon, node.name, "logs")
        for name, labels in (("web", {}), ("db", {"app": "db"}), ("job", {"app": "job"})):
            await place(wl1, ns, node.name, name, labels=labels)
        await tg.start(record, node.name)
        plan = await node.request(releases.releases[NEW], policy=NodePolicy.model_validate(
            {"drainRules": rules}))

        async def web_gone() -> bool:
            return "web" not in await on_node(wl1, node.name)

        await wait_for("web evicted", web_gone, 60, 0.1)
        assert {"db", "job", "logs"} <= await on_node(wl1, node.name)
        # the job completes (what its kubelet would report): db's group may go now
        await wl1.patch(PODS, "job", {"status": {"phase": "Succeeded"}}, ns,
                        subresource="status")
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        tg.cancel_scope.cancel()
    assert sig.status is not None
    assert sig.status.status is SignalState.COMPLETED, sig.status.reason
    assert await on_node(wl1, node.name) == {"logs", "job"}
    done_at = next(i for i, (n, _t, _d, ph) in enumerate(seen)
                   if n == "job" and ph == "Succeeded")
    db_gone = next(i for i, (n, t, d, _ph) in enumerate(seen)
                   if n == "db" and (d or t == "DELETED"))
    assert db_gone > done_at, seen  # group 10 only after group 0 was gone
    assert not any(n == "job" and (d or t == "DELETED") for n, t, d, _ in seen), seen
    assert set(sig.status.drain or ()) == {
        f"{ns}/web: evicted", f"{ns}/db: evicted",
        f"{mon}/logs: left running: MachineDrainRule a-monitoring: Skip",
        f"{ns}/job: waited for until completed: MachineDrainRule c-jobs: WaitCompleted"}
