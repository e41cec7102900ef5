"""What the real Cluster API manager does to a MachineDeployment, without CAPI's in-place
updates (default feature gates), at both pinned versions: provisioning through the
provider player, a version bump, the paused version move.

These tests record CAPI's behaviour that k0s-fleet's workers executor relies on
(docs/capi.md): which MachineSets it creates and which Machines it deletes.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.contract.signal import RUNNING_VERSION_KEY
from fleet.kube import KubeClient, KubeError
from fleet.kube.resources import MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES, NODES
from fleet.testing.capi import CapiCluster, create_capi_cluster
from fleet.testing.capimanager import CapiEnv, CapiEnvs, capi_versions
from fleet.testing.inplace_sequence import (
    PAUSED_ANNOTATION,
    InPlaceVersionMove,
    apply_version_move,
    plan_version_move,
)
from fleet.testing.providers import ProviderPlayer, kubelet_version, node_status
from fleet.testing.world import World
from tests.helpers.capienv import capi_namespace, playing, wait_for

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"


async def provisioned(env: CapiEnv, ns: str, count: int) -> dict[str, str]:
    async def linked() -> dict[str, str] | None:
        ms = [m for m in (await env.client.list(MACHINES, ns)).items
              if ((m.get("status") or {}).get("nodeRef") or {}).get("name")]
        return {m["metadata"]["name"]: m["metadata"]["uid"] for m in ms} \
            if len(ms) == count else None

    result: dict[str, str] = await wait_for(f"{count} Machines linked to Nodes", linked)
    return result


async def settled(env: CapiEnv, cluster: CapiCluster) -> dict[str, Any]:
    """The MD once CAPI has reconciled its current generation."""
    async def observed() -> dict[str, Any] | None:
        md = await env.client.get(MACHINE_DEPLOYMENTS, cluster.md, cluster.namespace)
        gen = md["metadata"]["generation"]
        ok = (md.get("status") or {}).get("observedGeneration", 0) >= gen
        return md if ok else None

    result: dict[str, Any] = await wait_for("CAPI to observe the MachineDeployment", observed)
    return result


async def machine_sets(env: CapiEnv, ns: str) -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in (await env.client.list(MACHINE_SETS, ns)).items}


async def upgrade_nodes_by_hand(wl: KubeClient, names: list[str], version: str) -> None:
    """What the node agents would leave behind: the nodes report ``version``."""
    for name in names:
        await wl.patch(NODES, name, {"metadata": {"annotations": {
            RUNNING_VERSION_KEY: version}}})
        await wl.patch(NODES, name, node_status(version), subresource="status")


@pytest.mark.parametrize("version", capi_versions())
async def test_version_bump_replaces_every_machine(
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, version: str) -> None:
    """OWNERSHIP fact 1, observed: a new MachineSet, the old Machines deleted."""
    env = await capi_envs.get(version)

    async def workload(_ns: str, _cluster: str) -> KubeClient:
        return wl1

    async with capi_namespace(env) as ns, playing(
            ProviderPlayer(env.client, workload, namespace=ns)):
        cluster = await create_capi_cluster(env.client, crds_installed["wl1"].kubeconfig(),
                                            namespace=ns, name="c1", version=V1, workers=2)
        before = await provisioned(env, ns, 2)
        sets_before = set(await machine_sets(env, ns))
        await env.client.patch(MACHINE_DEPLOYMENTS, cluster.md, {"spec": {"template": {
            "spec": {"version": V2}}}}, ns)

        async def replaced() -> bool:
            machines = (await env.client.list(MACHINES, ns)).items
            return not ({m["metadata"]["uid"] for m in machines} & set(before.values()))

        await wait_for("CAPI to replace the old Machines", replaced, timeout=180)
        assert len(set(await machine_sets(env, ns)) - sets_before) == 1


@pytest.mark.parametrize("version", capi_versions())
async def test_paused_version_move_keeps_every_machine(
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, version: str) -> None:
    """The in-place sequence for workers without CAPI's in-place updates: pause the MD,
    (upgrade the nodes), move the MachineSet template and every Machine to the target,
    unpause. CAPI then creates no MachineSet and deletes no Machine."""
    env = await capi_envs.get(version)

    async def workload(_ns: str, _cluster: str) -> KubeClient:
        return wl1

    async with capi_namespace(env) as ns, playing(
            ProviderPlayer(env.client, workload, namespace=ns)):
        cluster = await create_capi_cluster(env.client, crds_installed["wl1"].kubeconfig(),
                                            namespace=ns, name="c1", version=V1, workers=3)
        before = await provisioned(env, ns, 3)
        sets_before = await machine_sets(env, ns)
        await settled(env, cluster)

        md = await env.client.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
        move = plan_version_move(md, list(sets_before.values()),
                                 (await env.client.list(MACHINES, ns)).items, V2)
        assert isinstance(move, InPlaceVersionMove), move
        # 1. pause and write the version (CAPI must not see it unpaused yet)
        await apply_version_move(env.client, move, step="pause")
        md = await env.client.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
        assert PAUSED_ANNOTATION in md["metadata"]["annotations"]
        assert md["spec"]["template"]["spec"]["version"] == V2
        # 2. the nodes are upgraded in place (here: as the agents would leave them)
        await upgrade_nodes_by_hand(wl1, list(before), V2)
        # 3. MachineSet template and Machines to the target, then unpause
        await apply_version_move(env.client, move, step="finish")
        md = await env.client.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
        assert PAUSED_ANNOTATION not in (md["metadata"].get("annotations") or {})
        # A harmless spec change (deletion order) bumps the generation: once CAPI has
        # observed it, it has reconciled the unpaused MD with everything above.
        await env.client.patch(MACHINE_DEPLOYMENTS, cluster.md, {"spec": {"deletion": {
            "order": "Oldest"}}}, ns)
        md = await settled(env, cluster)
        machines = (await env.client.list(MACHINES, ns)).items
        sets_after = await machine_sets(env, ns)
        state = {"machineSets": {n: (s["spec"].get("replicas"),
                                     s["spec"]["template"]["spec"].get("version"))
                                 for n, s in sets_after.items()},
                 "machines": {m["metadata"]["name"]: (m["metadata"]["uid"], m["spec"]["version"],
                                                      m["metadata"].get("deletionTimestamp"))
                              for m in machines},
                 "md": md.get("status")}
        assert set(sets_after) == set(sets_before), f"CAPI created a MachineSet: {state}"
        assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == before, state
        assert not any(m["metadata"].get("deletionTimestamp") for m in machines), state
        assert {m["spec"]["version"] for m in machines} == {V2}, state
        assert (md.get("status") or {}).get("replicas") == 3, state


@pytest.mark.parametrize("version", capi_versions())
async def test_real_capi_provisions_a_machine_deployment(
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, version: str) -> None:
    env = await capi_envs.get(version)
    async with capi_namespace(env) as ns:
        cluster = await create_capi_cluster(env.client, crds_installed["wl1"].kubeconfig(),
                                            namespace=ns, name="c1", version=V1, workers=3)

        async def workload(_ns: str, _cluster: str) -> KubeClient:
            return wl1

        async with playing(ProviderPlayer(env.client, workload, namespace=ns)):
            async def linked() -> list[dict[str, Any]] | None:
                machines = (await env.client.list(MACHINES, ns)).items
                done = [m for m in machines if ((m.get("status") or {}).get("nodeRef") or {})
                        .get("name") and (m.get("status") or {}).get("phase") == "Running"]
                return machines if len(done) == 3 and len(machines) == 3 else None

            machines = await wait_for("3 Running Machines linked to Nodes", linked)

        sets = (await env.client.list(MACHINE_SETS, ns)).items
        assert len(sets) == 1, "CAPI created exactly one MachineSet"
        assert sets[0]["metadata"]["ownerReferences"][0]["name"] == cluster.md
        for m in machines:
            assert m["spec"]["version"] == V1
            assert m["metadata"]["labels"]["cluster.x-k8s.io/set-name"] == \
                sets[0]["metadata"]["name"]
            node = await wl1.get(NODES, m["status"]["nodeRef"]["name"])
            # The manager reached the workload cluster and annotated the Node it linked.
            ann = node["metadata"].get("annotations") or {}
            assert ann.get("cluster.x-k8s.io/machine") == m["metadata"]["name"]
            assert node["status"]["nodeInfo"]["kubeletVersion"] == kubelet_version(V1)

        # CAPI's validating webhook (served by the manager, reached through the rewritten
        # url + caBundle) refuses what the CRD schema alone would accept.
        with pytest.raises(KubeError, match=r"(?i)version"):
            await env.client.patch(MACHINE_DEPLOYMENTS, cluster.md, {"spec": {"template": {
                "spec": {"version": "not-a-version"}}}}, ns)
