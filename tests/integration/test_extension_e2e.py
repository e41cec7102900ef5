"""End to end: CAPI's in-place flow through the extension and the real controller.

Everything here is real except Cluster API itself and the node agents:

- the management objects (Cluster, kubeconfig Secret, MachineDeployment, MachineSet,
  worker Machines) and the workload Nodes come from ``fleet.testing.capi``;
- the ExtensionConfig is registered the way CAPI does it: a discovery call over HTTPS,
  whose handlers are written into ``status.handlers`` as ``<handler>.<config name>``;
- the k0s-fleet controller (``FleetController``) runs as in production: it does the
  dispatching for NodePlans (start, node signal, status mirror, completion) whoever
  created them; its standalone sequencer is told, through ``extension_active``, to leave
  this cluster to CAPI;
- the node side is ``fleet.testing.responder`` answering the agent protocol on the
  workload API server (the real agent is tested in test_agent_*.py);
- CAPI's part is played by ``CapiDriver`` from test_extension_capi.py: it marks one
  Machine at a time (maxUnavailable 1) and calls UpdateMachine until it says done.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.cli.upgrade import apply_upgrade, follow
from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import nodeplan_name
from fleet.contract.signal import RUNNING_VERSION_KEY
from fleet.controllers.runner import FleetController, Tuning
from fleet.controllers.trigger import Trigger
from fleet.events import EventRecorder
from fleet.extension import (
    ExtensionEndpoint,
    handlers_from_config,
    start_extension_server,
    workload_client_from_registry,
)
from fleet.extension.catalog import DISCOVERY_PATH
from fleet.extension.exclusion import ExtensionExclusion
from fleet.extension.selfsigned import make_cert_pair
from fleet.kube import KubeClient, NotFoundError
from fleet.kube.resources import (
    CONFIGMAPS,
    EXTENSION_CONFIGS,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
    NODES,
)
from fleet.rollout.annotations import ANN_EMERGENCY_STOP, ROLLOUT_CONFIGMAP
from fleet.rollout.policy import RolloutPolicy
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from fleet.world.model import ANN_CAPI_PAUSED, ANN_WRITTEN_VERSION
from tests.helpers.capi import CapiDriver, Extension
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
SERVICE = ExtensionEndpoint(service_name="k0s-fleet-extension",
                            service_namespace="k0s-fleet-system")


def fleet_config(namespace: str, cert: Path, key: Path) -> FleetConfig:
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "extension": {"enabled": True, "mode": "auto", "certFile": str(cert),
                      "keyFile": str(key)},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                     "digests": {V2: {"amd64": "d" * 64}}},
        "agent": {"drainTimeout": "1s", "verifyTimeout": "1s"},
    })


async def register_extension(mgmt: KubeClient, driver: CapiDriver, name: str,
                             namespace: str) -> dict[str, Any]:
    """Create the ExtensionConfig and do what CAPI's ExtensionConfig controller does."""
    await mgmt.create(EXTENSION_CONFIGS, {
        "metadata": {"name": name},
        "spec": {"clientConfig": {"service": {"name": SERVICE.service_name,
                                              "namespace": SERVICE.service_namespace,
                                              "port": 443}},
                 "namespaceSelector": {"matchExpressions": [{
                     "key": "kubernetes.io/metadata.name", "operator": "In",
                     "values": [namespace]}]}}})
    discovery = await driver.post_path(DISCOVERY_PATH, {
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"})
    assert discovery["status"] == "Success"
    handlers = [{**h, "name": f"{h['name']}.{name}"} for h in discovery["handlers"]]
    return await mgmt.patch(EXTENSION_CONFIGS, name, {"status": {"handlers": handlers}},
                            subresource="status")


@contextlib.asynccontextmanager
async def running_controller(mgmt: KubeClient, config: FleetConfig
                             ) -> AsyncIterator[FleetController]:
    # The production exclusion: ExtensionConfigs watched, extension-driven clusters held.
    trigger = Trigger()
    exclusion = ExtensionExclusion(mgmt, config, None, endpoint=SERVICE,
                                   on_change=trigger.poke)
    controller = FleetController(mgmt, config, tuning=Tuning(watch_timeout=30), trigger=trigger,
                                 policy=exclusion)
    async with anyio.create_task_group() as tg:
        tg.start_soon(exclusion.run)
        await tg.start(controller.run)
        try:
            yield controller
        finally:
            tg.cancel_scope.cancel()


async def test_capi_in_place_rollout_through_extension_and_controller(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, namespace: str,
        tmp_path: Path) -> None:
    await ensure_infra_crd(mgmt)
    cert, key, ca = make_cert_pair(["localhost"]).write(tmp_path / "tls")
    config = fleet_config(namespace, cert, key)
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(),
                              namespace=namespace, name=unique("c"), version=V1,
                              control_planes=0, workers=3, max_unavailable=1,
                              node_prefix=unique("e2e"))
    responder = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in fc.machines)
    ec_name = unique("k0s-fleet")
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        async with running_controller(mgmt, config) as controller:
            handlers = handlers_from_config(
                config, mgmt=mgmt,
                workload_client=workload_client_from_registry(controller.registry))
            server = await start_extension_server(handlers, cert_file=str(cert),
                                                  key_file=str(key), host="127.0.0.1", port=0)
            try:
                assert handlers.update is not None
                ext = Extension(server, ssl.create_default_context(cafile=str(ca)),
                                handlers.update)
                driver = CapiDriver(ext, mgmt)
                await register_extension(mgmt, driver, ec_name, namespace)
                # The controller must have seen the registration before the bump, as in a
                # real installation where the ExtensionConfig precedes any rollout.
                exclusion = controller.policy
                assert isinstance(exclusion, ExtensionExclusion)
                with anyio.fail_after(10):
                    while not exclusion.owns(namespace, fc.name):
                        await anyio.sleep(0.02)
                # The operator asks for the version (a FleetUpgrade); k0s-fleet writes the
                # MachineDeployment's version, CAPI asks whether the new MachineSet can be
                # reached in place, then walks the Machines one by one.
                await bump(mgmt, fc, V2)

                async def written() -> bool:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md or "", namespace)
                    return bool(md["spec"]["template"]["spec"]["version"] == V2)

                with anyio.fail_after(60):
                    while not await written():
                        await anyio.sleep(0.05)
                with anyio.fail_after(120):
                    for name in fc.workers:
                        await driver.start_in_place(await mgmt.get(MACHINES, name, namespace),
                                                    V2)
                        final = await driver.drive(name, namespace)
                        assert final.status == "Success" and final.retry_after == 0, \
                            driver.calls[-3:]
            finally:
                await server.close()
                with contextlib.suppress(NotFoundError):
                    await mgmt.delete(EXTENSION_CONFIGS, ec_name)
        tg.cancel_scope.cancel()

    plans = (await mgmt.list(NODE_PLANS, namespace)).items
    assert sorted(p["metadata"]["name"] for p in plans) == sorted(
        nodeplan_name(w, V2) for w in fc.workers)
    # Only the extension dispatched (the standalone sequencer held off), and the
    # controller's NodePlan reconciler carried every plan to Completed.
    assert {p["spec"]["source"] for p in plans} == {"runtime-extension"}
    assert {p["status"]["phase"] for p in plans} == {"Completed"}
    for w in fc.workers:
        node = await wl1.get(NODES, w)
        assert node["metadata"]["annotations"][RUNNING_VERSION_KEY] == V2
    # One Machine at a time, as CAPI sequenced it: never two requests on nodes at once.
    busy = sorted((s.at, s.node, s.state) for s in responder.steps)
    live: set[str] = set()
    for _, node_name, state in busy:
        if state in ("Completed",):
            live.discard(node_name)
        else:
            live.add(node_name)
        assert len(live) <= 1, busy


async def test_a_fleet_upgrade_through_the_extension_path(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, namespace: str,
        tmp_path: Path) -> None:
    """The intent where CAPI drives the workers through our extension: the controller (its
    rollout policy wrapped by the production exclusion, as `k0s-fleet controller` wires
    them) writes the MachineDeployment's version unpaused; UpdateMachine answers "not yet"
    while the rollout policy holds (here an emergency stop), then CAPI's calls carry every
    Machine through; the FleetUpgrade ends Complete."""
    await ensure_infra_crd(mgmt)
    cert, key, ca = make_cert_pair(["localhost"]).write(tmp_path / "tls")
    config = fleet_config(namespace, cert, key)
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(),
                              namespace=namespace, name=unique("c"), version=V1,
                              control_planes=0, workers=2, max_unavailable=1,
                              node_prefix=unique("fu"))
    assert fc.md is not None
    responder = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in fc.machines)
    ec_name = unique("k0s-fleet")
    # composed as the controller's entry point does: rollout policy wrapped by the exclusion
    trigger = Trigger()
    recorder = EventRecorder(mgmt, instance="k0s-fleet",
                             default_namespace=config.management.namespace)
    exclusion = ExtensionExclusion(mgmt, config, RolloutPolicy(mgmt, config, recorder=recorder),
                                   endpoint=SERVICE, on_change=trigger.poke)
    controller = FleetController(mgmt, config, tuning=Tuning(watch_timeout=30), trigger=trigger,
                                 recorder=recorder, policy=exclusion)
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        tg.start_soon(exclusion.run)
        await tg.start(controller.run)
        handlers = handlers_from_config(
            config, mgmt=mgmt, workload_client=workload_client_from_registry(controller.registry))
        server = await start_extension_server(handlers, cert_file=str(cert), key_file=str(key),
                                              host="127.0.0.1", port=0)
        try:
            assert handlers.update is not None
            driver = CapiDriver(Extension(server, ssl.create_default_context(cafile=str(ca)),
                                          handlers.update), mgmt)
            await register_extension(mgmt, driver, ec_name, namespace)
            with anyio.fail_after(10):
                while not exclusion.owns(namespace, fc.name):
                    await anyio.sleep(0.02)
            await apply_upgrade(mgmt, namespace=namespace, name="to-v2", version=V2,
                                selector=None)

            async def written() -> bool:
                md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)  # type: ignore[arg-type]
                return md["spec"]["template"]["spec"]["version"] == V2

            with anyio.fail_after(60):
                while not await written():
                    await anyio.sleep(0.05)
            md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)
            annotations = md["metadata"].get("annotations") or {}
            assert ANN_CAPI_PAUSED not in annotations  # CAPI drives: not paused
            assert annotations[ANN_WRITTEN_VERSION] == V2
            # An emergency stop: CAPI's UpdateMachine call is answered "not yet".
            await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"metadata": {"annotations": {
                ANN_EMERGENCY_STOP: "bad release"}}}, namespace)
            first = fc.workers[0]
            await driver.start_in_place(await mgmt.get(MACHINES, first, namespace), V2)
            call = await driver.update_machine_once(first, namespace)
            assert call.retry_after > 0 and "not yet: emergency stop" in call.message, call
            assert (await mgmt.list(NODE_PLANS, namespace)).items == []
            await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"metadata": {"annotations": {
                ANN_EMERGENCY_STOP: None}}}, namespace)
            with anyio.fail_after(120):
                for name in fc.workers:
                    if name != first:
                        await driver.start_in_place(await mgmt.get(MACHINES, name, namespace),
                                                    V2)
                    final = await driver.drive(name, namespace)
                    assert final.status == "Success" and final.retry_after == 0, \
                        driver.calls[-3:]
                fu = await follow(mgmt, namespace=namespace, name="to-v2", generation=1,
                                  out=_Sink(), poll=0.2)
            assert fu == 0
        finally:
            await server.close()
            with contextlib.suppress(NotFoundError):
                await mgmt.delete(EXTENSION_CONFIGS, ec_name)
        tg.cancel_scope.cancel()
    plans = (await mgmt.list(NODE_PLANS, namespace)).items
    assert {p["spec"]["source"] for p in plans} == {"runtime-extension"}
    assert {p["status"]["phase"] for p in plans} == {"Completed"}


class _Sink:
    def write(self, _s: str) -> None:
        pass

    def flush(self) -> None:
        pass
