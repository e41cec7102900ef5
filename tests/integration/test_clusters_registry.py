"""Workload cluster clients follow their kubeconfig Secrets (fleet.world.clusters)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from fleet.controllers.observe import SECRET_FIELD_SELECTOR
from fleet.kube import KubeClient
from fleet.kube.cache import ObjectCache
from fleet.kube.resources import CONTROL_NODES, CRDS, NODES, SECRETS
from fleet.kube.watch import Reflector
from fleet.testing.world import TEST_CRDS, World, crd_documents, install_crds
from fleet.world.clusters import ClusterRegistry, kubeconfig_secret
from tests.helpers.hooked import hooked_factory
from tests.helpers.names import unique


class SpyClient(KubeClient):
    closed: list[str] = []

    async def close(self) -> None:
        SpyClient.closed.append(self.name)
        await super().close()


async def spy_factory(kubeconfig: Mapping[str, Any], name: str) -> KubeClient:
    plain = await KubeClient.from_kubeconfig(kubeconfig, name=name)
    return SpyClient(plain._api, name=name)


async def wait_for(predicate: Any, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_secret_rotation_reconnects_the_workload_client(
        mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient, crds_installed: World,
        namespace: str) -> None:
    on_wl1, on_wl2 = unique("only-wl1"), unique("only-wl2")
    await wl1.create(NODES, {"metadata": {"name": on_wl1}})
    await wl2.create(NODES, {"metadata": {"name": on_wl2}})
    cluster, secret_name = "c1", "c1-kubeconfig"
    key = (namespace, cluster)
    bad = crds_installed["wl1"].kubeconfig(token="not-a-valid-token")
    await mgmt.create(SECRETS, kubeconfig_secret(secret_name, namespace, cluster, bad))

    secrets = ObjectCache("Secret")
    reflector = Reflector(mgmt, SECRETS, namespace=namespace, listener=secrets.on_event,
                          field_selector=SECRET_FIELD_SELECTOR)
    changes = 0

    def poke() -> None:
        nonlocal changes
        changes += 1

    registry = ClusterRegistry(secrets, on_change=poke, client_factory=spy_factory,
                               watch_timeout=30)
    SpyClient.closed.clear()
    async with anyio.create_task_group() as tg:
        tg.start_soon(reflector.run)
        await reflector.synced.wait()
        await tg.start(registry.run)

        def rewant() -> bool:
            registry.want({key: secret_name})  # what every controller pass does
            return True

        registry.want({key: secret_name})
        wc = registry.get(key)
        assert wc is not None
        await wait_for(lambda: wc.client is not None and wc.node_reflector is not None)
        await anyio.sleep(0.5)
        assert not wc.observed  # 401: nothing listed with a wrong token
        assert rewant() and registry.get(key) is wc

        # Rotate to a good token: the client is rebuilt and the Nodes appear.
        good = crds_installed["wl1"].kubeconfig()
        await mgmt.replace(SECRETS, {**kubeconfig_secret(secret_name, namespace, cluster, good),
                                     "metadata": {**(await mgmt.get(SECRETS, secret_name,
                                                                    namespace))["metadata"]}})
        await wait_for(lambda: secrets.get(secret_name, namespace) is not None
                       and registry.get(key) is not None
                       and rewant()
                       and registry.get(key) is not wc)
        wc2 = registry.get(key)
        assert wc2 is not None
        await wait_for(lambda: wc2.observed and wc2.nodes.get(on_wl1) is not None)
        assert wc2.nodes.get(on_wl2) is None
        await wait_for(lambda: "workload:" + f"{namespace}/{cluster}" in SpyClient.closed)

        # Rotate to another API server altogether (a moved control plane).
        moved = crds_installed["wl2"].kubeconfig()
        await mgmt.patch(SECRETS, secret_name, {"data": kubeconfig_secret(
            secret_name, namespace, cluster, moved)["data"]}, namespace)
        await wait_for(lambda: rewant()
                       and registry.get(key) is not wc2)
        wc3 = registry.get(key)
        assert wc3 is not None
        await wait_for(lambda: wc3.observed and wc3.nodes.get(on_wl2) is not None)
        assert wc3.nodes.get(on_wl1) is None
        assert registry.rebuilds == 3

        # The Secret goes away: the cluster is no longer observed, and says why.
        await mgmt.delete(SECRETS, secret_name, namespace)
        await wait_for(lambda: rewant()
                       and registry.get(key) is not wc3)
        wc4 = registry.get(key)
        assert wc4 is not None and not wc4.observed
        assert wc4.error is not None and "not found" in wc4.error

        # Not wanted any more: dropped.
        registry.want({})
        assert registry.get(key) is None
        tg.cancel_scope.cancel()
    assert changes > 0
    assert len(SpyClient.closed) == 3  # every client built was closed
    await wl1.delete(NODES, on_wl1)
    await wl2.delete(NODES, on_wl2)


# -- autopilot CRDs that come and go, on a private API server ---------------------------------

@pytest.fixture(scope="module")
def bare() -> Any:
    """An API server without the autopilot CRDs (a cluster without autopilot)."""
    w = World(["bare"])
    w.start()
    try:
        yield w
    finally:
        w.close()


@pytest.mark.anyio
async def test_absent_autopilot_crds_are_watched_not_polled(bare: World) -> None:
    docs = {d["spec"]["names"]["plural"]: d for d in crd_documents(TEST_CRDS)}
    secrets = ObjectCache("Secret")
    secrets.observe({**kubeconfig_secret("c-kubeconfig", "ns", "c", bare["bare"].kubeconfig()),
                     "metadata": {"name": "c-kubeconfig", "namespace": "ns",
                                  "resourceVersion": "1"}})
    paths: list[str] = []

    async def note(method: str, path: str) -> None:
        paths.append(f"{method} {path}")

    registry = ClusterRegistry(secrets, on_change=lambda: None, watch_timeout=60,
                               client_factory=hooked_factory(note))
    lists = f"GET {CONTROL_NODES.path()}"
    async with await bare["bare"].client() as admin, anyio.create_task_group() as tg:
        await tg.start(registry.run)
        registry.want({("ns", "c"): "c-kubeconfig"})
        wc = registry.get(("ns", "c"))
        assert wc is not None
        await wait_for(lambda: wc.observed and wc.control_nodes.synced and wc.plans.synced,
                       timeout=60)
        assert len(wc.control_nodes) == 0 and len(wc.plans) == 0
        # While the CRD is absent nobody asks for ControlNodes again (the old backoff
        # polling listed them at 1, 2, 4, 8 s): the CRD itself is watched.
        await wait_for(lambda: wc.client is not None, timeout=10)
        before = paths.count(lists)
        assert before >= 1  # the first look found no CRD
        await anyio.sleep(10)
        assert paths.count(lists) == before
        # the CRD appears: its objects follow
        await install_crds(admin, [docs["controlnodes"]])
        await admin.create(CONTROL_NODES, {"metadata": {"name": "cp-0"}})
        await wait_for(lambda: wc.control_nodes.get("cp-0") is not None, timeout=60)
        # the CRD goes: so do its objects; it comes back: so do they
        await admin.delete(CRDS, docs["controlnodes"]["metadata"]["name"])
        await wait_for(lambda: wc.control_nodes.get("cp-0") is None, timeout=60)
        await install_crds(admin, [docs["controlnodes"]])
        await admin.create(CONTROL_NODES, {"metadata": {"name": "cp-1"}})
        await wait_for(lambda: wc.control_nodes.get("cp-1") is not None, timeout=60)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_cluster_is_settled_only_once_its_control_nodes_answered(bare: World) -> None:
    """Its Nodes listed is not enough: a k0s controller without a kubelet is known only
    from its ControlNode, and a restarted controller planning before those are listed
    (or found not served) would count that control plane missing, write so, and write it
    back a moment later. (Before, ``settled`` looked at the Nodes alone.)"""
    release = anyio.Event()

    async def hold_control_nodes(method: str, path: str) -> None:
        if path.startswith(CONTROL_NODES.path()):
            await release.wait()

    secrets = ObjectCache("Secret")
    secrets.observe({**kubeconfig_secret("h-kubeconfig", "ns", "h", bare["bare"].kubeconfig()),
                     "metadata": {"name": "h-kubeconfig", "namespace": "ns",
                                  "resourceVersion": "1"}})
    registry = ClusterRegistry(secrets, on_change=lambda: None, watch_timeout=60,
                               client_factory=hooked_factory(hold_control_nodes))
    key = ("ns", "h")
    async with anyio.create_task_group() as tg:
        await tg.start(registry.run)
        registry.want({key: "h-kubeconfig"})
        wc = registry.get(key)
        assert wc is not None
        await wait_for(lambda: wc.observed and wc.plans.synced, timeout=60)
        assert not wc.control_nodes.synced
        assert not registry.settled(key)
        release.set()
        await wait_for(lambda: registry.settled(key), timeout=60)
        assert wc.control_nodes.synced
        tg.cancel_scope.cancel()
