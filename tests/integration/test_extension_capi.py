"""The runtime extension driven the way Cluster API drives it, against real API servers.

``CapiDriver`` plays CAPI's part (v1.12, ``machinedeployment_canupdatemachineset.go`` and
``machine_controller_inplace_update.go``): it asks CanUpdateMachineSet over HTTPS,
applies the returned patch with an independent RFC 6902 implementation and compares,
marks the Machine for an in-place update, then calls UpdateMachine again and again,
honouring ``retryAfterSeconds`` on a scaled clock (1 s of CAPI time = 10 ms here) until
it answers done, and finally removes its annotations.

The node side is SIMULATED in this module: ``NodeSide`` plays the controller's NodePlan
reconciler plus the node agent by patching the NodePlan's status through the agent's
states and the workload Node's running-version annotation and Ready condition. Each
phase is held until the driver has seen it, so the test can check the retry delay CAPI
was told for every phase. (An end-to-end test through the real NodePlan reconciler and
simulated nodes belongs next to this once that reconciler exists.)
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleet.artifacts import ArtifactResolver
from fleet.config.models import DownloadSettings, FleetConfig
from fleet.contract.nodeplan import (
    LABEL_MACHINE,
    TRACEPARENT_ANNOTATION,
    build_nodeplan,
    label_value,
    nodeplan_name,
)
from fleet.contract.signal import HAPPY_PATH, RUNNING_VERSION_KEY, SignalState
from fleet.extension import (
    ExtensionHandlers,
    SecretWorkloadClients,
    UpdateMachineService,
    extension_drives,
    handlers_from_config,
    start_extension_server,
)
from fleet.extension.progress import RETRY_AFTER_SECONDS, UNOBSERVABLE_RETRY_SECONDS
from fleet.extension.selfsigned import make_cert_pair
from fleet.extension.wire import Hook
from fleet.kube import AlreadyExistsError, KubeClient, NotFoundError, UnreachableError
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    K0S_WORKER_CONFIG_TEMPLATES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
    NODES,
    SECRETS,
)
from fleet.rollout.annotations import ANN_EMERGENCY_STOP, ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.state import RolloutState
from fleet.testing.world import World
from fleet.world.clusters import kubeconfig_secret
from fleet.world.model import ANN_WRITTEN_VERSION, NODEPLAN_FINALIZER
from tests.helpers.capi import CapiDriver, Extension
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

OLD = "v1.31.3+k0s.0"
NEW = "v1.32.1+k0s.0"
DIGEST = "b" * 64




# -- fixtures -------------------------------------------------------------------------------



@pytest.fixture
async def extension(mgmt: KubeClient, wl1: KubeClient,
                    tmp_path: Path) -> AsyncIterator[Extension]:
    cert, key, ca = make_cert_pair(["localhost"]).write(tmp_path / "tls")

    async def workload(namespace: str, cluster: str) -> KubeClient:
        return wl1

    service = UpdateMachineService(
        mgmt=mgmt, workload_client=workload,
        artifacts=ArtifactResolver(DownloadSettings(digests={NEW: {"amd64": DIGEST}})),
        drives=extension_drives(mgmt, "always"),
    )
    server = await start_extension_server(ExtensionHandlers(update=service),
                                          cert_file=str(cert), key_file=str(key),
                                          host="127.0.0.1", port=0)
    try:
        yield Extension(server, ssl.create_default_context(cafile=str(ca)), service)
    finally:
        await server.close()


@asynccontextmanager
async def config_driver(config: FleetConfig, mgmt: KubeClient, wl1: KubeClient,
                        tls_dir: Path) -> AsyncIterator[CapiDriver]:
    """The extension as ``handlers_from_config`` builds it from ``config`` (every workload
    cluster is ``wl1``), served with TLS, and a driver calling it as CAPI does."""
    cert, key, ca = make_cert_pair(["localhost"]).write(tls_dir)

    async def workload(_namespace: str, _cluster: str) -> KubeClient:
        return wl1

    # every cluster on the extension path, whatever the config's extension.mode
    handlers = handlers_from_config(
        config, mgmt=mgmt, workload_client=workload,
        drives=extension_drives(mgmt, "always"))
    server = await start_extension_server(handlers, cert_file=str(cert), key_file=str(key),
                                          host="127.0.0.1", port=0)
    try:
        yield CapiDriver(Extension(server, ssl.create_default_context(cafile=str(ca)),
                                   UpdateMachineService(mgmt=mgmt)), mgmt)
    finally:
        await server.close()


async def make_machine(mgmt: KubeClient, wl1: KubeClient, namespace: str, *,
                       ready: bool = True, running: str = OLD) -> tuple[dict[str, Any], str]:
    """A worker Machine of MachineDeployment md-0 and its workload Node; md-0 (made here
    unless the test made its own) carries k0s-fleet's record of NEW, the fleet's target
    the extension checks requests against."""
    name = unique("md-0-x")
    node = unique("node")
    labels = {"cluster.x-k8s.io/deployment-name": "md-0"}
    with suppress(AlreadyExistsError):
        await mgmt.create(MACHINE_DEPLOYMENTS, {
            "metadata": {"name": "md-0", "namespace": namespace,
                         "annotations": {ANN_WRITTEN_VERSION: NEW}},
            "spec": {"clusterName": "c1", "replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "clusterName": "c1", "version": NEW,
                         "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                                     "kind": "K0sWorkerConfigTemplate",
                                                     "name": "md-0"}},
                         "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                               "kind": "DockerMachineTemplate",
                                               "name": "md-0"}}}}}, namespace)
    machine = await mgmt.create(MACHINES, {
        "metadata": {"name": name, "namespace": namespace, "labels": {
            "cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/deployment-name": "md-0"}},
        "spec": {
            "clusterName": "c1", "version": OLD,
            "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                        "kind": "K0sWorkerConfig", "name": name}},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                  "kind": "DockerMachine", "name": name},
        },
    })
    machine = await mgmt.patch(MACHINES, name, {"status": {"nodeRef": {"name": node}}},
                               namespace, subresource="status")
    await wl1.create(NODES, {"metadata": {"name": node, "labels": {"kubernetes.io/arch": "amd64"},
                                          "annotations": {RUNNING_VERSION_KEY: running}}})
    await set_node(wl1, node, ready=ready)
    return machine, node


async def set_node(wl1: KubeClient, node: str, *, ready: bool,
                   running: str | None = None) -> None:
    if running is not None:
        await wl1.patch(NODES, node, {"metadata": {"annotations": {RUNNING_VERSION_KEY: running}}})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await wl1.patch(NODES, node, {"status": {"conditions": [{
        "type": "Ready", "status": "True" if ready else "False", "reason": "Test",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, subresource="status")


# -- CAPI's part ----------------------------------------------------------------------------





# -- the simulated node side ----------------------------------------------------------------

@dataclass
class NodeSide:
    """SIMULATION of the NodePlan reconciler + agent: writes NodePlan status and the Node."""

    mgmt: KubeClient
    wl1: KubeClient
    driver: CapiDriver

    async def wait_plan(self, name: str, namespace: str) -> dict[str, Any]:
        while True:
            plan = await self.mgmt.get_or_none(NODE_PLANS, name, namespace)
            if plan is not None:
                return plan
            await anyio.sleep(0.02)

    async def set_status(self, name: str, namespace: str, **status: Any) -> None:
        await self.mgmt.patch(NODE_PLANS, name, {"status": status}, namespace,
                              subresource="status")

    async def until_seen(self, needle: str) -> None:
        """Hold the current phase until CAPI has been answered about it."""
        while not any(needle in c.message for c in self.driver.calls):
            await self.driver.seen.wait()

    async def succeed(self, plan_name: str, namespace: str, node: str) -> None:
        await self.wait_plan(plan_name, namespace)
        await self.until_seen("Pending")
        for state in HAPPY_PATH[:-1]:
            await self.set_status(plan_name, namespace, phase="InProgress", nodeState=str(state))
            await self.until_seen(f" {state} ")
        # Completed on the plan, but the Node is still restarting: CAPI must keep waiting.
        await set_node(self.wl1, node, ready=False, running=NEW)
        await self.set_status(plan_name, namespace, phase="Completed", nodeState="Completed",
                              runningVersion=NEW)
        await self.until_seen("NotReady")
        await set_node(self.wl1, node, ready=True)

    async def fail(self, plan_name: str, namespace: str) -> None:
        await self.wait_plan(plan_name, namespace)
        await self.set_status(plan_name, namespace, phase="InProgress", nodeState="Downloading")
        await self.until_seen(" Downloading ")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.set_status(
            plan_name, namespace, phase="Failed", nodeState="FailedDownload",
            message="sha256 mismatch: got 3f2a, want bbbb",
            conditions=[{"type": "Failed", "status": "True", "reason": "FailedDownload",
                         "lastTransitionTime": now}])


def machine_set(namespace: str, version: str) -> dict[str, Any]:
    return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
            "metadata": {"name": f"md-0-{version[3:5]}", "namespace": namespace},
            "spec": {"clusterName": "c1", "replicas": 1, "template": {"spec": {
                "clusterName": "c1", "version": version,
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                            "kind": "K0sWorkerConfigTemplate", "name": "md-0"}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                      "kind": "DockerMachineTemplate", "name": "md-0"}}}}}


async def plans_for(mgmt: KubeClient, namespace: str, machine: str) -> list[dict[str, Any]]:
    listed = await mgmt.list(NODE_PLANS, namespace,
                             label_selector=f"{LABEL_MACHINE}={label_value(machine)}")
    return listed.items


# -- tests ------------------------------------------------------------------------------------

async def test_in_place_update_driven_like_capi_to_completion(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, extension: Extension) -> None:
    machine, node = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    driver = CapiDriver(extension, mgmt)
    side = NodeSide(mgmt, wl1, driver)
    with anyio.fail_after(60):
        assert await driver.can_update_machine_set(machine_set(namespace, OLD),
                                                   machine_set(namespace, NEW))
        await driver.start_in_place(machine, NEW)
        async with anyio.create_task_group() as tg:
            tg.start_soon(side.succeed, nodeplan_name(name, NEW), namespace, node)
            final = await driver.drive(name, namespace)

    assert final.status == "Success" and final.retry_after == 0, driver.calls[-3:]
    assert "runs k0s v1.32.1+k0s.0 and is Ready" in final.message
    # One NodePlan, created by the extension, owned by the Machine, with the pinned digest.
    plans = await plans_for(mgmt, namespace, name)
    assert len(plans) == 1
    plan = plans[0]
    assert plan["spec"]["source"] == "runtime-extension"
    assert plan["spec"]["sha256"] == DIGEST and plan["spec"]["nodeName"] == node
    assert plan["spec"]["ownerKind"] == "MachineDeployment" and plan["spec"]["ownerName"] == "md-0"
    assert plan["metadata"]["ownerReferences"][0]["uid"] == machine["metadata"]["uid"]
    assert plan["metadata"]["finalizers"] == [NODEPLAN_FINALIZER]
    # CAPI was told to come back sooner or later depending on the phase.
    by_phase = {}
    for c in driver.calls:
        for state in [*(str(s) for s in HAPPY_PATH[:-1]), "Pending"]:
            if f" {state} " in c.message:
                by_phase[state] = c.retry_after
    assert by_phase["Downloading"] == RETRY_AFTER_SECONDS[SignalState.DOWNLOADING]
    assert by_phase["ApplyingUpdate"] == RETRY_AFTER_SECONDS[SignalState.APPLYING_UPDATE]
    assert by_phase["Pending"] == RETRY_AFTER_SECONDS["Pending"]
    assert len(set(by_phase.values())) >= 3
    waiting_ready = [c for c in driver.calls if "NotReady" in c.message]
    assert waiting_ready and all(c.retry_after > 0 for c in waiting_ready)
    # Completed: CAPI removed its markers; a call now is not CAPI's: refused, nothing
    # written.
    again = await driver.update_machine_once(name, namespace)
    assert again.status == "Failure" and "InPlaceUpdateInProgress" in again.message, again
    assert len(await plans_for(mgmt, namespace, name)) == 1


async def test_in_place_update_driven_like_capi_to_failure(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, extension: Extension) -> None:
    machine, _ = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    plan_name = nodeplan_name(name, NEW)
    driver = CapiDriver(extension, mgmt)
    side = NodeSide(mgmt, wl1, driver)
    with anyio.fail_after(60):
        await driver.start_in_place(machine, NEW)
        async with anyio.create_task_group() as tg:
            tg.start_soon(side.fail, plan_name, namespace)
            final = await driver.drive(name, namespace)
    assert final.status == "Failure"
    assert "FailedDownload" in final.message and "sha256 mismatch" in final.message
    assert plan_name in final.message
    # CAPI retries failures: the answer stays the same, no second NodePlan appears.
    again = await driver.update_machine_once(name, namespace)
    assert again.status == "Failure" and again.message == final.message
    assert len(await plans_for(mgmt, namespace, name)) == 1
    # Deleting the failed NodePlan (the documented retry) makes the next call start over.
    await mgmt.delete(NODE_PLANS, plan_name, namespace)
    gone = await driver.update_machine_once(name, namespace)
    assert gone.status == "Success" and "being deleted" in gone.message
    # SIMULATED reconciler: takes the request off the node, then releases its finalizer.
    await mgmt.patch(NODE_PLANS, plan_name, {"metadata": {"finalizers": None}}, namespace)
    with anyio.fail_after(30):
        while (await mgmt.get_or_none(NODE_PLANS, plan_name, namespace)) is not None:
            await anyio.sleep(0.02)
    fresh = await driver.update_machine_once(name, namespace)
    assert fresh.status == "Success" and fresh.retry_after > 0 and "Pending" in fresh.message


async def test_concurrent_duplicate_calls_create_one_nodeplan(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, extension: Extension) -> None:
    machine, _ = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    driver = CapiDriver(extension, mgmt)
    await driver.start_in_place(machine, NEW)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(driver.update_machine_once, name, namespace)
    assert len(driver.calls) == 12
    assert all(c.status == "Success" and c.retry_after > 0 for c in driver.calls), driver.calls
    plans = await plans_for(mgmt, namespace, name)
    assert [p["metadata"]["name"] for p in plans] == [nodeplan_name(name, NEW)]


async def test_adopts_a_nodeplan_the_standalone_controller_created(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, extension: Extension) -> None:
    machine, node = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    theirs = await mgmt.create(NODE_PLANS, build_nodeplan(
        machine=machine, node_name=node, role="worker", version=NEW,
        url="https://example.com/k0s", sha256="c" * 64, source="controller"))
    driver = CapiDriver(extension, mgmt)
    await driver.start_in_place(machine, NEW)
    call = await driver.update_machine_once(name, namespace)
    assert call.status == "Success" and call.retry_after > 0
    plans = await plans_for(mgmt, namespace, name)
    assert len(plans) == 1 and plans[0]["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert plans[0]["spec"]["source"] == "controller"


async def test_node_already_on_target_needs_no_nodeplan(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, extension: Extension) -> None:
    machine, _ = await make_machine(mgmt, wl1, namespace, running=NEW)
    name = machine["metadata"]["name"]
    driver = CapiDriver(extension, mgmt)
    await driver.start_in_place(machine, NEW)
    call = await driver.update_machine_once(name, namespace)
    assert call.status == "Success" and call.retry_after == 0 and "already runs" in call.message
    assert await plans_for(mgmt, namespace, name) == []


async def test_problems_answer_clearly(mgmt: KubeClient, wl1: KubeClient, namespace: str,
                                       extension: Extension) -> None:
    driver = CapiDriver(extension, mgmt)
    # A Machine the management cluster does not have.
    ghost = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
             "metadata": {"name": "ghost", "namespace": namespace},
             "spec": {"clusterName": "c1", "version": NEW}}
    resp = await driver.post(Hook.UPDATE_MACHINE, {"desired": {"machine": ghost}})
    assert resp["status"] == "Failure" and "not found" in resp["message"]
    # An unreachable workload cluster: keep CAPI waiting, dispatch nothing blind.
    machine, _ = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    await driver.start_in_place(machine, NEW)

    async def unreachable(namespace: str, cluster: str) -> KubeClient:
        raise UnreachableError("c1: connection refused")

    extension.service.workload_client = unreachable
    call = await driver.update_machine_once(name, namespace)
    assert call.status == "Success" and call.retry_after == UNOBSERVABLE_RETRY_SECONDS
    assert "connection refused" in call.message
    assert await plans_for(mgmt, namespace, name) == []
    # No digest for the target version: refuse, and say what to configure.
    extension.service.artifacts = ArtifactResolver(DownloadSettings())

    async def workload(namespace: str, cluster: str) -> KubeClient:
        return wl1

    extension.service.workload_client = workload
    call = await driver.update_machine_once(name, namespace)
    assert call.status == "Failure" and "no sha256" in call.message
    with pytest.raises(NotFoundError):
        await mgmt.get(NODE_PLANS, nodeplan_name(name, NEW), namespace)


async def test_fleet_config_executor_and_pause_apply(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    """handlers_from_config: the cluster's executor goes into the NodePlan; pause holds."""
    await mgmt.create(CLUSTERS, {"metadata": {"name": "c1", "namespace": namespace,
                                              "labels": {"tier": "prod"}},
                                 "spec": {"paused": False}})
    digests = {"download": {"digests": {NEW: {"amd64": DIGEST}}}}
    for raw, expect_plan in (({**digests, "rollout": {"paused": True}}, False),
                             ({**digests, "executor": "autopilot"}, True)):
        config = FleetConfig.model_validate(raw)
        machine, _ = await make_machine(mgmt, wl1, namespace)
        name = machine["metadata"]["name"]
        async with config_driver(config, mgmt, wl1, tmp_path / "tls") as driver:
            await driver.start_in_place(machine, NEW)
            call = await driver.update_machine_once(name, namespace)
        plans = await plans_for(mgmt, namespace, name)
        assert call.status == "Success" and call.retry_after > 0, call
        if expect_plan:
            assert [p["spec"]["executor"] for p in plans] == ["autopilot"]
        else:
            assert plans == [] and "paused" in call.message


async def test_fleet_config_digest_manifest_is_honoured(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    """handlers_from_config: no pinned digest, only download.digestManifestUrl: the
    extension fetches the manifest and the NodePlan carries the digest it lists."""
    listed = "d" * 64
    (tmp_path / NEW).mkdir()
    (tmp_path / NEW / "sha256sums.txt").write_text(f"{listed}  k0s-{NEW}-amd64\n")
    config = FleetConfig.model_validate({"download": {
        "digestManifestUrl": f"file://{tmp_path}/{{version}}/sha256sums.txt"}})

    machine, _ = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    async with config_driver(config, mgmt, wl1, tmp_path / "tls") as driver:
        await driver.start_in_place(machine, NEW)
        call = await driver.update_machine_once(name, namespace)
    assert call.status == "Success" and call.retry_after > 0, call
    (plan,) = await plans_for(mgmt, namespace, name)
    assert plan["spec"]["sha256"] == listed and plan["spec"]["allowUnverified"] is False


async def test_dispatch_is_traced_and_the_nodeplan_carries_the_context(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, extension: Extension) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    extension.service.tracer = provider.get_tracer("test")
    machine, _ = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    machine_tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await mgmt.patch(MACHINES, name, {"metadata": {"annotations": {
        TRACEPARENT_ANNOTATION: machine_tp}}}, namespace)
    driver = CapiDriver(extension, mgmt)
    await driver.start_in_place(machine, NEW)
    await driver.update_machine_once(name, namespace)
    await driver.update_machine_once(name, namespace)  # adopting: no second dispatch span
    (span,) = exporter.get_finished_spans()
    assert span.name == "UpdateMachine dispatch"
    assert [f"{link.context.trace_id:032x}" for link in span.links] == [machine_tp.split("-")[1]]
    (plan,) = await plans_for(mgmt, namespace, name)
    tp = plan["metadata"]["annotations"][TRACEPARENT_ANNOTATION]
    assert span.context is not None
    assert tp.split("-")[1:3] == [f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"]
    provider.shutdown()


async def test_missing_node_is_not_dispatched(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, extension: Extension) -> None:
    machine, node = await make_machine(mgmt, wl1, namespace)
    name = machine["metadata"]["name"]
    await wl1.delete(NODES, node)
    driver = CapiDriver(extension, mgmt)
    await driver.start_in_place(machine, NEW)
    call = await driver.update_machine_once(name, namespace)
    assert call.status == "Success" and call.retry_after > 0 and "not found" in call.message
    assert await plans_for(mgmt, namespace, name) == []


async def test_workload_clients_from_kubeconfig_secrets(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, namespace: str) -> None:
    """Non-leader replicas reach workload clusters through the kubeconfig Secret."""
    clients = SecretWorkloadClients(mgmt)
    try:
        with pytest.raises(UnreachableError, match="not found"):
            await clients(namespace, "c1")
        kubeconfig = crds_installed["wl1"].kubeconfig()
        await mgmt.create(SECRETS, kubeconfig_secret("c1-kubeconfig", namespace, "c1",
                                                     kubeconfig))
        first = await clients(namespace, "c1")
        node = unique("node")
        await wl1.create(NODES, {"metadata": {"name": node}})
        assert (await first.get(NODES, node))["metadata"]["name"] == node
        assert await clients(namespace, "c1") is first and clients.builds == 1
        # A rotated Secret gets a new client.
        rotated = {**kubeconfig, "preferences": {"colors": False}}
        await mgmt.patch(SECRETS, "c1-kubeconfig", kubeconfig_secret(
            "c1-kubeconfig", namespace, "c1", rotated), namespace)
        second = await clients(namespace, "c1")
        assert second is not first and clients.builds == 2
        assert (await second.get(NODES, node))["metadata"]["name"] == node
        await mgmt.patch(SECRETS, "c1-kubeconfig", {"data": {"value": "bm90IHlhbWw6IFs="}},
                         namespace)
        with pytest.raises(UnreachableError, match="c1"):
            await clients(namespace, "c1")
    finally:
        await clients.close()


async def test_update_machine_answers_not_yet_while_the_rollout_policy_holds(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    """handlers_from_config: the fleet rollout policy (the rollout ConfigMap's switches and
    the controller's record of admitted clusters) holds UpdateMachine before any dispatch."""
    await mgmt.create(CLUSTERS, {"metadata": {"name": "c1", "namespace": namespace},
                                 "spec": {"paused": False}})
    config = FleetConfig.model_validate({"management": {"namespace": namespace},
                                         "download": {"digests": {NEW: {"amd64": DIGEST}}}})
    cm = await mgmt.create(CONFIGMAPS, {
        "metadata": {"name": ROLLOUT_CONFIGMAP, "namespace": namespace,
                     "annotations": {ANN_EMERGENCY_STOP: "bad release"}},
        "data": {STATE_KEY: RolloutState().to_json()}}, namespace)
    async with config_driver(config, mgmt, wl1, tmp_path / "tls") as driver:
        machine, _ = await make_machine(mgmt, wl1, namespace)
        name = machine["metadata"]["name"]
        await driver.start_in_place(machine, NEW)
        call = await driver.update_machine_once(name, namespace)
        assert call.status == "Success" and call.retry_after > 0
        assert "not yet: emergency stop" in call.message and "bad release" in call.message
        # Stop lifted, but the controller has not admitted the cluster to its wave.
        await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"metadata": {"annotations": {
            ANN_EMERGENCY_STOP: None}}}, namespace)
        call = await driver.update_machine_once(name, namespace)
        assert call.retry_after > 0 and "has not admitted" in call.message, call
        assert await plans_for(mgmt, namespace, name) == []
        # Admitted (as the controller records it before its first start): dispatched.
        state = RolloutState(admitted={f"{namespace}/c1": "x"})
        await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"data": {STATE_KEY: state.to_json()}},
                         namespace)
        call = await driver.update_machine_once(name, namespace)
        assert "not yet" not in call.message, call
    assert cm["metadata"]["name"] == ROLLOUT_CONFIGMAP
    assert [p["metadata"]["name"] for p in await plans_for(mgmt, namespace, name)] == [
        nodeplan_name(name, NEW)]


async def test_update_machine_holds_while_the_worker_template_was_changed_by_someone_else(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    """The MD's K0sWorkerConfigTemplate, kept in step by k0s-fleet (its record on it), has
    a version someone else wrote: UpdateMachine answers "not yet" naming the template, as
    the controller holds the MD's own nodes; set back to what k0s-fleet wrote, it goes."""
    await mgmt.create(CLUSTERS, {"metadata": {"name": "c1", "namespace": namespace},
                                 "spec": {"paused": False}})
    await mgmt.create(CONFIGMAPS, {
        "metadata": {"name": ROLLOUT_CONFIGMAP, "namespace": namespace},
        "data": {STATE_KEY: RolloutState(admitted={f"{namespace}/c1": "x"}).to_json()}},
        namespace)
    written = {"annotations": {ANN_WRITTEN_VERSION: NEW}}
    await mgmt.create(K0S_WORKER_CONFIG_TEMPLATES, {
        "metadata": {"name": "md-0-w", "namespace": namespace, **written},
        "spec": {"template": {"spec": {"version": "v1.33.0+k0s.0"}}}}, namespace)
    labels = {"cluster.x-k8s.io/deployment-name": "md-0"}
    await mgmt.create(MACHINE_DEPLOYMENTS, {
        "metadata": {"name": "md-0", "namespace": namespace, **written},
        "spec": {"clusterName": "c1", "replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "clusterName": "c1", "version": NEW,
                     "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                                 "kind": "K0sWorkerConfigTemplate",
                                                 "name": "md-0-w"}},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "DockerMachineTemplate",
                                           "name": "md-0"}}}}}, namespace)
    config = FleetConfig.model_validate({"management": {"namespace": namespace},
                                         "download": {"digests": {NEW: {"amd64": DIGEST}}}})
    async with config_driver(config, mgmt, wl1, tmp_path / "tls") as driver:
        machine, _ = await make_machine(mgmt, wl1, namespace)
        name = machine["metadata"]["name"]
        await driver.start_in_place(machine, NEW)
        call = await driver.update_machine_once(name, namespace)
        assert call.status == "Success" and call.retry_after > 0, call
        assert "not yet: K0sWorkerConfigTemplate md-0-w" in call.message, call
        assert "changed to v1.33.0+k0s.0 by someone else" in call.message, call
        assert await plans_for(mgmt, namespace, name) == []
        await mgmt.patch(K0S_WORKER_CONFIG_TEMPLATES, "md-0-w", {"spec": {"template": {
            "spec": {"version": NEW}}}}, namespace)
        call = await driver.update_machine_once(name, namespace)
        assert "not yet" not in call.message, call
    assert [p["metadata"]["name"] for p in await plans_for(mgmt, namespace, name)] == [
        nodeplan_name(name, NEW)]
