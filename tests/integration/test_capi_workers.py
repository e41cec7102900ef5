"""The controller's own worker executors against the real Cluster API manager (default
feature gates: no CAPI in-place updates), at both pinned versions.

* Paused in place: a FleetUpgrade; the controller writes the MachineDeployment's version
  together with its pause, upgrades every node through NodePlans (real agents on
  simulated nodes), pauses the MachineSet, moves its template's and the Machines'
  versions, and releases both pauses. CAPI creates no MachineSet and deletes no Machine,
  and the Machines stay at the target once CAPI reconciles the unpaused objects.

The providers are played through their contracts (``ProviderPlayer``); the
K0sControlPlane is a stand-in with no Machines.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.cli.upgrade import apply_upgrade
from fleet.config import FleetConfig
from fleet.controllers.runner import FleetController
from fleet.kube import KubeClient
from fleet.kube.resources import MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES, NODE_PLANS
from fleet.model import ANN_CAPI_PAUSED, ANN_PAUSED_FOR, ANN_WRITTEN_VERSION
from fleet.planner import conditions as C
from fleet.testing.capi import create_capi_cluster
from fleet.testing.capimanager import CapiEnvs, capi_versions
from fleet.testing.providers import ProviderPlayer
from fleet.testing.releases import ReleaseServer
from fleet.testing.simfarm import SimNodeFarm
from fleet.testing.world import World
from tests.helpers.capienv import capi_namespace, playing, wait_for
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"


def fleet_config(namespace: str, download: str, digest: str) -> FleetConfig:
    deadline = "60s"
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": download, "digests": {V2: {"amd64": digest}}},
        "agent": {"drainTimeout": "20s", "verifyTimeout": "20s"},
        "rollout": {"progressDeadlines": {k: deadline for k in (
            "pending", "downloading", "cordoning", "applyingUpdate", "restarting",
            "verifying", "unCordoning")}},
    })


@contextlib.asynccontextmanager
async def running_controller(mgmt: KubeClient, config: FleetConfig
                             ) -> AsyncIterator[FleetController]:
    controller = FleetController(mgmt, config, watch_timeout=30)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        try:
            yield controller
        finally:
            tg.cancel_scope.cancel()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory for simulated nodes (a unix socket's path must stay short)."""
    path = Path(tempfile.mkdtemp(prefix="capi-w-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype), {})


def anns(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


async def linked(mgmt: KubeClient, ns: str, count: int) -> list[dict[str, Any]] | None:
    ms = [m for m in (await mgmt.list(MACHINES, ns)).items
          if ((m.get("status") or {}).get("nodeRef") or {}).get("name")
          and not m["metadata"].get("deletionTimestamp")]
    return ms if len(ms) == count else None


@pytest.mark.parametrize("version", capi_versions())
async def test_the_paused_md_executor_upgrades_in_place_next_to_the_real_capi(
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, short_tmp: Path,
        version: str) -> None:
    env = await capi_envs.get(version)
    mgmt = env.client
    kubeconfig = crds_installed["wl1"].kubeconfig()
    async with capi_namespace(env) as ns, ReleaseServer() as rs:
        old, new = rs.add(V1), rs.add(V2)
        config = fleet_config(ns, rs.base_url + "/k0s/{version}?arch={arch}", new.sha256)
        farm = SimNodeFarm(kubeconfig, short_tmp, old)

        async def workload(_ns: str, _cluster: str) -> KubeClient:
            return wl1

        player = ProviderPlayer(mgmt, workload, node_factory=farm.node_factory, namespace=ns)
        async with anyio.create_task_group() as tg:
            await tg.start(farm.run)
            async with playing(player):
                cluster = await create_capi_cluster(
                    mgmt, kubeconfig, namespace=ns, name=unique("c"), version=V1, workers=3,
                    max_unavailable=1, max_surge=0, control_plane_replicas=0)
                machines = await wait_for("3 Machines linked to Nodes",
                                          lambda: linked(mgmt, ns, 3))
                before = {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines}
                sets_before = {s["metadata"]["name"]
                               for s in (await mgmt.list(MACHINE_SETS, ns)).items}
                async with running_controller(mgmt, config):
                    await apply_upgrade(mgmt, namespace=ns, name="to-v2", version=V2,
                                        selector=None)

                    async def released() -> bool:
                        md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                        sets = (await mgmt.list(MACHINE_SETS, ns)).items
                        return (md["spec"]["template"]["spec"]["version"] == V2
                                and anns(md).get(ANN_WRITTEN_VERSION) == V2
                                and ANN_CAPI_PAUSED not in anns(md)
                                and all(ANN_CAPI_PAUSED not in anns(s) for s in sets)
                                and cond(md, C.UP_TO_DATE).get("status") == "True")

                    await wait_for("the MachineDeployment upgraded and released", released,
                                   timeout=300)

                # CAPI reconciles the unpaused MD and MachineSet: wait until its status
                # has seen their last generation, then read what it did.
                async def capi_caught_up() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
                    sets = (await mgmt.list(MACHINE_SETS, ns)).items
                    return all((o.get("status") or {}).get("observedGeneration")
                               == o["metadata"]["generation"] for o in [md, *sets])

                await wait_for("CAPI to observe the unpaused objects", capi_caught_up)
                for n in farm.nodes.values():
                    assert await n.running_version() == V2, (n.name, n.history)
            tg.cancel_scope.cancel()

        machines = (await mgmt.list(MACHINES, ns)).items
        sets_after = {s["metadata"]["name"] for s in (await mgmt.list(MACHINE_SETS, ns)).items}
        state = {m["metadata"]["name"]: (m["spec"]["version"],
                                         m["metadata"].get("deletionTimestamp"))
                 for m in machines}
        assert sets_after == sets_before, f"CAPI created a MachineSet: {sets_after}"
        assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == before, state
        assert not any(m["metadata"].get("deletionTimestamp") for m in machines), state
        assert {m["spec"]["version"] for m in machines} == {V2}, state
        [ms] = (await mgmt.list(MACHINE_SETS, ns)).items
        assert ms["spec"]["template"]["spec"]["version"] == V2
        assert ANN_PAUSED_FOR not in anns(ms)
        plans = (await mgmt.list(NODE_PLANS, ns)).items
        assert sorted(p["spec"]["machineName"] for p in plans) == sorted(before)
        assert {p["status"]["phase"] for p in plans} == {"Completed"}
        for n in farm.nodes.values():
            assert n.restarts == 1, (n.name, n.history)
