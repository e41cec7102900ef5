"""Hostile calls to the runtime extension, over HTTPS, on the real test world.

Anyone who reaches the extension's port can POST a hook request, and its body says
whatever the sender likes. These tests send what such a sender would: UpdateMachine for an
existing Machine that Cluster API is not updating (its body carrying CAPI's in-place
markers, forged), with a downgrade, a skip of two minors, or a version that is not the
Machine's; and CanUpdateMachine with a skip of two minors. The extension is built as the
controller builds it (``handlers_from_config``), with a pinned digest for every version
asked for, so that nothing but its checks stands between the request and a NodePlan.
Each refusal must name the check that failed and leave the management and workload
clusters exactly as they were.

Nothing is simulated here but the caller: the API servers are real, the Machine, its
MachineDeployment and Cluster, and the workload Node are real objects.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet.config.models import FleetConfig
from fleet.contract.signal import RUNNING_VERSION_KEY
from fleet.extension import handlers_from_config, start_extension_server
from fleet.extension.selfsigned import make_cert_pair
from fleet.extension.wire import Hook
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    EVENTS,
    K0S_CONTROL_PLANES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
    NODES,
)
from fleet.world.fence import write_cluster
from fleet.world.model import ANN_WRITTEN_VERSION
from tests.helpers.capi import PENDING_HOOKS, UPDATE_IN_PROGRESS, CapiDriver, Extension
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

OLD = "v1.31.3+k0s.0"
NEW = "v1.32.1+k0s.0"
PATCH_AHEAD = "v1.32.2+k0s.0"
TWO_AHEAD = "v1.34.1+k0s.0"
DIGEST = "e" * 64
FORGED = {UPDATE_IN_PROGRESS: "", PENDING_HOOKS: "UpdateMachine"}  # CAPI's markers


@dataclass
class Scene:
    """A worker Machine of MachineDeployment md-0 of Cluster ``cluster``, at NEW, its
    node running NEW; k0s-fleet's record on the MachineDeployment says NEW."""

    namespace: str
    cluster: str
    machine: dict[str, Any]
    node: str


async def make_scene(mgmt: KubeClient, wl1: KubeClient, namespace: str) -> Scene:
    cluster = unique("c")
    await mgmt.create(CLUSTERS, {"metadata": {"name": cluster, "namespace": namespace},
                                 "spec": {"paused": False}})
    labels = {"cluster.x-k8s.io/cluster-name": cluster,
              "cluster.x-k8s.io/deployment-name": "md-0"}
    refs = {"bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                        "kind": "K0sWorkerConfigTemplate", "name": "md-0"}},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                  "kind": "DockerMachineTemplate", "name": "md-0"}}
    await mgmt.create(MACHINE_DEPLOYMENTS, {
        "metadata": {"name": "md-0", "namespace": namespace,
                     "annotations": {ANN_WRITTEN_VERSION: NEW}},
        "spec": {"clusterName": cluster, "replicas": 1,
                 "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"clusterName": cluster, "version": NEW, **refs}}}},
        namespace)
    name, node = unique("md-0-x"), unique("node")
    await mgmt.create(MACHINES, {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"clusterName": cluster, "version": NEW,
                 "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                             "kind": "K0sWorkerConfig", "name": name}},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                       "kind": "DockerMachine", "name": name}}})
    machine = await mgmt.patch(MACHINES, name, {"status": {"nodeRef": {"name": node}}},
                               namespace, subresource="status")
    await wl1.create(NODES, {"metadata": {"name": node,
                                          "labels": {"kubernetes.io/arch": "amd64"},
                                          "annotations": {RUNNING_VERSION_KEY: NEW}}})
    await wl1.patch(NODES, node, {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "Test",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
    return Scene(namespace, cluster, machine, node)


def config(namespace: str, mode: str) -> FleetConfig:
    """Digests pinned for every version the tests ask for: only the checks refuse."""
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        # enabled as in production (the files are not read: the test serves its own)
        "extension": {"enabled": True, "mode": mode, "certFile": "/unused/tls.crt",
                      "keyFile": "/unused/tls.key"},
        "download": {"digests": {v: {"amd64": DIGEST}
                                 for v in (OLD, NEW, PATCH_AHEAD, TWO_AHEAD)}}})


@asynccontextmanager
async def serving(cfg: FleetConfig, mgmt: KubeClient, wl1: KubeClient,
                  tls_dir: Path, *, writer: KubeClient | None = None
                  ) -> AsyncIterator[CapiDriver]:
    """The extension as the controller builds it, on loopback with TLS; ``writer``: the
    (fenced) client it writes with, as the controller passes its own."""
    cert, key, ca = make_cert_pair(["localhost"]).write(tls_dir)

    async def workload(_namespace: str, _cluster: str) -> KubeClient:
        return wl1

    handlers = handlers_from_config(cfg, mgmt=writer or mgmt, workload_client=workload)
    assert handlers.update is not None
    server = await start_extension_server(handlers, cert_file=str(cert), key_file=str(key),
                                          host="127.0.0.1", port=0)
    try:
        yield CapiDriver(Extension(server, ssl.create_default_context(cafile=str(ca)),
                                   handlers.update), mgmt)
    finally:
        await server.close()


def update_request(scene: Scene, version: str) -> dict[str, Any]:
    """What a forger sends: the Machine as it is, with CAPI's markers added and the version
    it wants."""
    meta = scene.machine["metadata"]
    return {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
            "kind": "UpdateMachineRequest",
            "desired": {"machine": {
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "labels": meta["labels"], "annotations": FORGED},
                "spec": {**scene.machine["spec"], "version": version}}}}


async def state_of(mgmt: KubeClient, wl1: KubeClient, scene: Scene) -> dict[str, Any]:
    """Everything the extension could write, by resourceVersion."""
    ns = scene.namespace
    out: dict[str, Any] = {}
    for res in (CLUSTERS, MACHINE_DEPLOYMENTS, MACHINES, NODE_PLANS, CONFIGMAPS, EVENTS):
        out[res.kind] = sorted((o["metadata"]["name"], o["metadata"]["resourceVersion"])
                               for o in (await mgmt.list(res, ns)).items)
    node = await wl1.get(NODES, scene.node)
    out["Node"] = node["metadata"]["resourceVersion"]
    return out


async def test_forged_downgrade_of_a_machine_capi_is_not_updating_is_refused(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    scene = await make_scene(mgmt, wl1, namespace)
    async with serving(config(namespace, "auto"), mgmt, wl1, tmp_path / "tls") as driver:
        before = await state_of(mgmt, wl1, scene)
        resp = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, OLD))
        after = await state_of(mgmt, wl1, scene)
    assert resp["status"] == "Failure", resp
    msg = resp["message"]
    assert "refused by k0s-fleet" in msg, msg
    assert "InPlaceUpdateInProgress: Cluster API is not updating" in msg, msg
    assert f"NoDowngrade: node of Machine {namespace}/" in msg and OLD in msg, msg
    assert f"LiveSpecVersion: the request asks for {OLD}" in msg, msg
    assert f"FleetTarget: the fleet's target for MachineDeployment md-0 is {NEW}" in msg, msg
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []
    assert after == before  # nothing else written either


async def test_forged_skip_of_two_minors_is_refused_naming_the_rule(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    scene = await make_scene(mgmt, wl1, namespace)
    async with serving(config(namespace, "always"), mgmt, wl1, tmp_path / "tls") as driver:
        before = await state_of(mgmt, wl1, scene)
        resp = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, TWO_AHEAD))
        after = await state_of(mgmt, wl1, scene)
    assert resp["status"] == "Failure", resp
    assert "OneMinorAtATime" in resp["message"] and TWO_AHEAD in resp["message"], resp
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []
    assert after == before


async def test_a_version_that_is_not_the_machines_is_refused(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    """Cluster API really is updating the Machine (its markers on the live object) to the
    fleet's target NEW; a request for another version, even one patch ahead, is refused.
    The request CAPI itself would send goes through: the refusal is the check's doing."""
    scene = await make_scene(mgmt, wl1, namespace)
    meta = scene.machine["metadata"]
    scene.machine = await mgmt.patch(MACHINES, meta["name"], {"metadata": {
        "annotations": FORGED}}, namespace)
    await wl1.patch(NODES, scene.node, {"metadata": {"annotations": {RUNNING_VERSION_KEY: OLD}}})
    async with serving(config(namespace, "always"), mgmt, wl1, tmp_path / "tls") as driver:
        before = await state_of(mgmt, wl1, scene)
        resp = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, PATCH_AHEAD))
        after = await state_of(mgmt, wl1, scene)
        assert resp["status"] == "Failure", resp
        assert (f"LiveSpecVersion: the request asks for {PATCH_AHEAD} but Machine "
                f"{namespace}/{meta['name']} has spec.version {NEW}") in resp["message"], resp
        assert "InPlaceUpdateInProgress" not in resp["message"], resp
        assert (await mgmt.list(NODE_PLANS, namespace)).items == []
        assert after == before
        ok = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, NEW))
    assert ok["status"] == "Success" and ok["retryAfterSeconds"] > 0, ok
    (plan,) = (await mgmt.list(NODE_PLANS, namespace)).items
    assert plan["spec"]["version"] == NEW and plan["spec"]["machineName"] == meta["name"]


async def test_update_machine_writes_are_fenced_for_the_cluster(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    """The NodePlan is written through the client the extension is given, marked as a
    write for the Machine's cluster (fleet.world.fence.writes_for), like the controller's: a
    replica whose fence does not admit that cluster writes nothing and tells CAPI to ask
    again; one whose fence admits it dispatches."""
    scene = await make_scene(mgmt, wl1, namespace)
    meta = scene.machine["metadata"]
    scene.machine = await mgmt.patch(MACHINES, meta["name"], {"metadata": {
        "annotations": FORGED}}, namespace)
    await wl1.patch(NODES, scene.node, {"metadata": {"annotations": {RUNNING_VERSION_KEY: OLD}}})
    mine = (namespace, scene.cluster)
    cfg = config(namespace, "always")
    others = mgmt.fenced(lambda: write_cluster() not in (None, mine))
    async with serving(cfg, mgmt, wl1, tmp_path / "a", writer=others) as driver:
        held = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, NEW))
    assert held["status"] == "Success" and held["retryAfterSeconds"] > 0, held
    assert "not dispatched by this replica" in held["message"], held
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []
    holder = mgmt.fenced(lambda: write_cluster() == mine)
    async with serving(cfg, mgmt, wl1, tmp_path / "b", writer=holder) as driver:
        ok = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, NEW))
    assert ok["status"] == "Success" and ok["retryAfterSeconds"] > 0, ok
    assert [p["spec"]["version"] for p in (await mgmt.list(NODE_PLANS, namespace)).items] == [
        NEW]


async def test_can_update_machine_declines_a_skip_of_two_minors(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path) -> None:
    def machine(version: str) -> dict[str, Any]:
        return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "m1", "namespace": namespace},
                "spec": {"clusterName": "c1", "version": version,
                         "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                                     "kind": "K0sWorkerConfig", "name": "m1"}},
                         "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                               "kind": "DockerMachine", "name": "m1"}}}

    boot = {"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "K0sWorkerConfig",
            "metadata": {"name": "m1", "namespace": namespace}, "spec": {}}
    infra = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
             "metadata": {"name": "m1", "namespace": namespace}, "spec": {"customImage": "i"}}

    def request(cur: str, want: str) -> dict[str, Any]:
        return {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
                "kind": "CanUpdateMachineRequest",
                "current": {"machine": machine(cur), "infrastructureMachine": infra,
                            "bootstrapConfig": boot},
                "desired": {"machine": machine(want), "infrastructureMachine": infra,
                            "bootstrapConfig": boot}}

    async with serving(config(namespace, "always"), mgmt, wl1, tmp_path / "tls") as driver:
        skip = await driver.post(Hook.CAN_UPDATE_MACHINE, request(NEW, TWO_AHEAD))
        one = await driver.post(Hook.CAN_UPDATE_MACHINE, request(OLD, NEW))
    assert skip["status"] == "Success" and "machinePatch" not in skip, skip
    assert "OneMinorAtATime" in skip["message"] and TWO_AHEAD in skip["message"], skip
    assert one["status"] == "Success" and "machinePatch" in one, one


@pytest.mark.parametrize("hosted", [False, True], ids=["K0sControlPlane",
                                                      "K0smotronControlPlane"])
async def test_workers_are_never_moved_past_the_oldest_control_plane(
        mgmt: KubeClient, wl1: KubeClient, namespace: str, tmp_path: Path,
        hosted: bool) -> None:
    """The cluster's control plane still runs v1.31 (a K0sControlPlane's spec and status,
    or what k0smotron reports of a hosted one): CanUpdateMachineSet to v1.32 for its
    workers is declined naming WorkersNotNewerThanControlPlanes, and so is an
    UpdateMachine that passes every other check."""
    scene = await make_scene(mgmt, wl1, namespace)
    cp_res = K0SMOTRON_CONTROL_PLANES if hosted else K0S_CONTROL_PLANES
    if hosted:
        await mgmt.create(K0SMOTRON_CONTROL_PLANES, {
            "metadata": {"name": "cp", "namespace": namespace},
            "spec": {"version": OLD, "replicas": 1}}, namespace)
        await mgmt.patch(K0SMOTRON_CONTROL_PLANES, "cp", {"status": {
            "version": OLD, "replicas": 1, "readyReplicas": 1}}, namespace,
            subresource="status")
    else:
        await mgmt.create(K0S_CONTROL_PLANES, {
            "metadata": {"name": "cp", "namespace": namespace},
            "spec": {"version": OLD, "replicas": 0, "updateStrategy": "InPlace",
                     "machineTemplate": {"infrastructureRef": {
                         "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                         "kind": "DockerMachineTemplate", "name": "cp"}},
                     "k0sConfigSpec": {}}}, namespace)
    await mgmt.patch(CLUSTERS, scene.cluster, {"spec": {"controlPlaneRef": {
        "apiGroup": cp_res.group, "kind": cp_res.kind, "name": "cp"}}}, namespace)
    meta = scene.machine["metadata"]
    scene.machine = await mgmt.patch(MACHINES, meta["name"], {"metadata": {
        "annotations": FORGED}}, namespace)
    await wl1.patch(NODES, scene.node, {"metadata": {"annotations": {RUNNING_VERSION_KEY: OLD}}})

    def machine_set(version: str) -> dict[str, Any]:
        return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
                "metadata": {"name": "md-0-x", "namespace": namespace},
                "spec": {"clusterName": scene.cluster, "replicas": 1, "template": {"spec": {
                    "clusterName": scene.cluster, "version": version,
                    "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                                "kind": "K0sWorkerConfigTemplate",
                                                "name": "md-0"}},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                          "kind": "DockerMachineTemplate", "name": "md-0"}}}}}

    boot = {"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
            "kind": "K0sWorkerConfigTemplate",
            "metadata": {"name": "md-0", "namespace": namespace},
            "spec": {"template": {"spec": {}}}}
    infra = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
             "kind": "DockerMachineTemplate",
             "metadata": {"name": "md-0", "namespace": namespace},
             "spec": {"template": {"spec": {}}}}
    request = {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
               "kind": "CanUpdateMachineSetRequest",
               "current": {"machineSet": machine_set(OLD), "bootstrapConfigTemplate": boot,
                           "infrastructureMachineTemplate": infra},
               "desired": {"machineSet": machine_set(NEW), "bootstrapConfigTemplate": boot,
                           "infrastructureMachineTemplate": infra}}
    async with serving(config(namespace, "always"), mgmt, wl1, tmp_path / "tls") as driver:
        before = await state_of(mgmt, wl1, scene)
        can = await driver.post(Hook.CAN_UPDATE_MACHINE_SET, request)
        upd = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, NEW))
        after = await state_of(mgmt, wl1, scene)
        assert can["status"] == "Success" and "machineSetPatch" not in can, can
        assert "WorkersNotNewerThanControlPlanes" in can["message"], can
        assert upd["status"] == "Failure", upd
        assert "WorkersNotNewerThanControlPlanes" in upd["message"] and OLD in upd["message"]
        assert (await mgmt.list(NODE_PLANS, namespace)).items == []
        assert after == before
        # the control plane on v1.32: both go ahead
        await mgmt.patch(cp_res, "cp", {"spec": {"version": NEW}}, namespace)
        if hosted:  # k0smotron has rolled its pods
            await mgmt.patch(K0SMOTRON_CONTROL_PLANES, "cp", {"status": {"version": NEW}},
                             namespace, subresource="status")
        can = await driver.post(Hook.CAN_UPDATE_MACHINE_SET, request)
        upd = await driver.post(Hook.UPDATE_MACHINE, update_request(scene, NEW))
    assert "machineSetPatch" in can, can
    assert upd["status"] == "Success" and upd["retryAfterSeconds"] > 0, upd
