"""The extension path to completion, driven by the real Cluster API manager.

At both pinned CAPI versions, with the ``RuntimeSDK`` and ``InPlaceUpdates`` gates on:
the manager discovers k0s-fleet's runtime extension through an ExtensionConfig (``url``
+ ``caBundle``), and when the MachineDeployment's version changes it asks
CanUpdateMachineSet, moves the Machines to the new MachineSet without recreating them
and calls UpdateMachine on each; the extension dispatches NodePlans that the k0s-fleet
controller carries through with real agents on simulated nodes (``SimNodeFarm``).

Nothing stands for Cluster API here. The providers are played through their contracts
(``ProviderPlayer``); the K0sControlPlane is a stand-in with no Machines.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.config import FleetConfig
from fleet.controllers.runner import FleetController
from fleet.extension import (
    ExtensionEndpoint,
    handlers_from_config,
    start_extension_server,
    workload_client_from_registry,
)
from fleet.extension.exclusion import ExtensionExclusion
from fleet.extension.selfsigned import make_cert_pair
from fleet.kube import KubeClient, NotFoundError
from fleet.kube.resources import (
    EXTENSION_CONFIGS,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
)
from fleet.planner import conditions as C
from fleet.testing.capi import create_capi_cluster
from fleet.testing.capimanager import IN_PLACE_GATES, CapiEnvs, capi_version, capi_versions
from fleet.testing.providers import ProviderPlayer
from fleet.testing.releases import ReleaseServer
from fleet.testing.simfarm import SimNodeFarm
from fleet.testing.world import World
from tests.helpers.capienv import capi_namespace, playing, wait_for
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
UPDATE_IN_PROGRESS = "in-place-updates.internal.cluster.x-k8s.io/update-in-progress"
PENDING_HOOKS = "runtime.cluster.x-k8s.io/pending-hooks"


def fleet_config(namespace: str, cert: Path, key: Path, download: str, digest: str
                 ) -> FleetConfig:
    deadline = "60s"
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "extension": {"enabled": True, "mode": "auto", "certFile": str(cert),
                      "keyFile": str(key)},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": download, "digests": {V2: {"amd64": digest}}},
        "agent": {"drainTimeout": "20s", "verifyTimeout": "20s"},
        "rollout": {"progressDeadlines": {k: deadline for k in (
            "pending", "downloading", "cordoning", "applyingUpdate", "restarting",
            "verifying", "unCordoning")}},
    })


@contextlib.asynccontextmanager
async def running_controller(mgmt: KubeClient, config: FleetConfig,
                             endpoint: ExtensionEndpoint) -> AsyncIterator[FleetController]:
    controller = FleetController(mgmt, config, watch_timeout=30)
    controller.policy = ExtensionExclusion(mgmt, config, None, endpoint=endpoint,
                                           on_change=controller.trigger.poke)
    async with anyio.create_task_group() as tg:
        tg.start_soon(controller.policy.run)
        await tg.start(controller.run)
        try:
            yield controller
        finally:
            tg.cancel_scope.cancel()


def cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype), {})


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory for simulated nodes (a unix socket's path must stay short)."""
    path = Path(tempfile.mkdtemp(prefix="capi-nodes-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("version", capi_versions())
async def test_real_capi_drives_in_place_upgrade_through_the_extension(  # noqa: PLR0917
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient, tmp_path: Path,
        short_tmp: Path, version: str) -> None:
    env = await capi_envs.get(version, IN_PLACE_GATES)
    mgmt = env.client
    kubeconfig = crds_installed["wl1"].kubeconfig()
    cert, key, ca = make_cert_pair(["localhost"]).write(tmp_path / "tls")
    async with capi_namespace(env) as ns, ReleaseServer() as rs:
        old, new = rs.add(V1), rs.add(V2)
        config = fleet_config(ns, cert, key, rs.base_url + "/k0s/{version}?arch={arch}",
                              new.sha256)
        name = unique("c")
        farm = SimNodeFarm(kubeconfig, short_tmp, old)

        async def workload(_ns: str, _cluster: str) -> KubeClient:
            return wl1

        player = ProviderPlayer(mgmt, workload, node_factory=farm.node_factory)
        ec_name = unique("k0s-fleet")
        async with anyio.create_task_group() as tg:
            await tg.start(farm.run)
            async with playing(player):
                cluster = await create_capi_cluster(
                    mgmt, kubeconfig, namespace=ns, name=name, version=V1, workers=3,
                    max_unavailable=1, max_surge=0)

                async def linked() -> list[dict[str, Any]] | None:
                    ms = [m for m in (await mgmt.list(MACHINES, ns)).items
                          if ((m.get("status") or {}).get("nodeRef") or {}).get("name")]
                    return ms if len(ms) == 3 else None

                before = {m["metadata"]["name"]: m["metadata"]["uid"]
                          for m in await wait_for("3 Machines linked to Nodes", linked)}
                sets_before = {s["metadata"]["name"]
                               for s in (await mgmt.list(MACHINE_SETS, ns)).items}

                async with running_controller(mgmt, config, ExtensionEndpoint(url="")) as c:
                    handlers = handlers_from_config(
                        config, mgmt=mgmt,
                        workload_client=workload_client_from_registry(c.registry))
                    server = await start_extension_server(
                        handlers, cert_file=str(cert), key_file=str(key), host="127.0.0.1",
                        port=0)
                    try:
                        exclusion = c.policy
                        assert isinstance(exclusion, ExtensionExclusion)
                        exclusion.endpoint = ExtensionEndpoint(url=server.url)
                        # Registered as a user would; CAPI's ExtensionConfig controller does
                        # the discovery call itself and records our handlers.
                        await mgmt.create(EXTENSION_CONFIGS, {
                            "metadata": {"name": ec_name},
                            "spec": {"clientConfig": {
                                "url": server.url,
                                "caBundle": base64.b64encode(ca.read_bytes()).decode()},
                                "namespaceSelector": {"matchLabels": {
                                    "kubernetes.io/metadata.name": ns}}}})

                        async def discovered() -> bool:
                            return exclusion.owns(ns, name)

                        await wait_for("CAPI to discover the extension", discovered)
                        await mgmt.patch(MACHINE_DEPLOYMENTS, cluster.md, {"spec": {
                            "template": {"spec": {"version": V2}}}}, ns)

                        async def upgraded() -> bool:
                            ms = (await mgmt.list(MACHINES, ns)).items
                            nodes = [farm.nodes.get(m["metadata"]["name"]) for m in ms]
                            running = [await n.running_version() if n else None
                                       for n in nodes]
                            return (len(ms) == 3
                                    and all(m["spec"]["version"] == V2 for m in ms)
                                    and not any(UPDATE_IN_PROGRESS in (
                                        m["metadata"].get("annotations") or {}) for m in ms)
                                    and running == [V2] * 3)

                        await wait_for("every node upgraded in place", upgraded, timeout=300)
                    finally:
                        await server.close()
                        with contextlib.suppress(NotFoundError):
                            await mgmt.delete(EXTENSION_CONFIGS, ec_name)
            tg.cancel_scope.cancel()

        machines = (await mgmt.list(MACHINES, ns)).items
        # Every Machine kept its name and UID: upgraded in place, none recreated.
        assert {m["metadata"]["name"]: m["metadata"]["uid"] for m in machines} == before
        plans = (await mgmt.list(NODE_PLANS, ns)).items
        assert sorted(p["spec"]["machineName"] for p in plans) == sorted(before)
        assert {p["spec"]["source"] for p in plans} == {"runtime-extension"}
        assert {p["status"]["phase"] for p in plans} == {"Completed"}
        for n in farm.nodes.values():
            assert n.restarts == 1, (n.name, n.history)
        sets_after = {s["metadata"]["name"]: s for s in (await mgmt.list(MACHINE_SETS, ns)).items}
        new_sets = set(sets_after) - sets_before
        # CAPI moved the Machines to a new MachineSet (CanUpdateMachineSet said yes).
        assert len(new_sets) == 1, sets_after.keys()
        assert {m["metadata"]["labels"]["cluster.x-k8s.io/set-name"]
                for m in machines} == new_sets
        md = await mgmt.get(MACHINE_DEPLOYMENTS, cluster.md, ns)
        # k0s-fleet's condition judges by what the nodes report.
        assert cond(md, C.UP_TO_DATE).get("status") == "True", md.get("status")
        if version == capi_version():
            # OWNERSHIP fact 5: CAPI v1.14 compares the kubelet's v1.31.3+k0s with the
            # Machine's v1.31.3+k0s.0 and never calls these Machines UpToDate.
            for m in machines:
                assert cond(m, "UpToDate").get("status") != "True", m["status"]
