"""The controller chart's identity is enough to run an in-place upgrade, and refused the rest.

The chart is installed with helm into the management API server. The controller then
runs exactly as the chart's Deployment would start it: its container args and
environment (fieldRefs resolved), its fleet YAML from the installed ConfigMap, and a
token of the chart's ServiceAccount from the TokenRequest API in place of the projected
one. It leads through the Lease and upgrades a CAPI cluster (a K0sControlPlane and a
MachineDeployment) whose node side is played by :class:`fleet.testing.responder.NodeResponder`
(the real agent under its own chart identity: test_rbac_agent.py, test_rbac_exact.py).
The same identity is then refused what the controller must not do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
import yaml

from fleet.kube import ForbiddenError, KubeClient
from fleet.kube.resources import (
    CONFIGMAPS,
    EXTENSION_CONFIGS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    LEASES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
    PODS,
    SECRETS,
    SERVICE_ACCOUNTS,
)
from fleet.nodeplan import NodePlanPhase
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.capi import INFRA_GROUP, INFRA_MACHINES, create_cluster, ensure_infra_crd
from fleet.testing.responder import NodeResponder
from fleet.testing.world import ApiServer, World, free_port
from fleet.upgrade_cli import apply_upgrade, upgrade_object
from tests.conftest import unique
from tests.integration.test_chart_install import (
    CLUSTER_ROLE_BINDINGS,
    DEPLOYMENTS,
    create_namespace,
    helm_cli,
    kubeconfig_file,
)
from tests.unit.test_chart_render import CONTROLLER_CHART, pod_spec

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
AUDIENCE = "https://kubernetes.default.svc"
RBAC = "rbac.authorization.k8s.io"


def chart_values(capi_ns: str) -> dict[str, Any]:
    """The values an operator would write (the test cluster's infra kind included)."""
    return {
        "replicaCount": 1,
        "leaderElection": {"leaseDurationSeconds": 15},
        "rbac": {"infrastructureMachines": [
            {"apiGroup": INFRA_GROUP, "resources": [INFRA_MACHINES.plural]}]},
        "fleet": {
            "clusters": {"namespaces": [capi_ns]},
            "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                         "allowUnverified": True},
            "agent": {"drainTimeout": "1s", "verifyTimeout": "1s"},
            "rollout": {"progressDeadlines": {"pending": "10s"}},
        },
    }


@dataclass
class ControllerInstall:
    namespace: str
    release: str
    capi_namespace: str
    service_account: str
    deployment: dict[str, Any]
    fleet_yaml: str


async def install_controller(server: ApiServer, admin: KubeClient, directory: Path,
                             values: dict[str, Any], *, namespace: str, capi_namespace: str
                             ) -> ControllerInstall:
    release = unique("k0s-fleet")
    values_file = directory / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    await helm_cli("install", release, CONTROLLER_CHART, "--namespace", namespace,
                   "--create-namespace", "--values", values_file,
                   "--kubeconfig", kubeconfig_file(server, directory))
    deploy = await admin.get(DEPLOYMENTS, release, namespace)
    cm = await admin.get(CONFIGMAPS, release, namespace)
    return ControllerInstall(namespace, release, capi_namespace,
                             pod_spec(deploy)["serviceAccountName"], deploy,
                             cm["data"]["fleet.yaml"])


async def service_account_token(admin: KubeClient, namespace: str, name: str) -> str:
    resp = await admin.create_subresource(
        SERVICE_ACCOUNTS, name, "token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600}}, namespace)
    return str(resp["status"]["token"])


def deployment_command(inst: ControllerInstall, pod_name: str, kubeconfig: Path,
                       config: Path) -> tuple[list[str], dict[str, str]]:
    """The Deployment's container command line and environment, as the kubelet would run
    it, with the fleet YAML and the token from files instead of volumes."""
    (c,) = pod_spec(inst.deployment)["containers"]
    fields = {"metadata.name": pod_name, "metadata.namespace": inst.namespace}
    env = {}
    for e in c["env"]:
        env[e["name"]] = (e["value"] if "value" in e
                          else fields[e["valueFrom"]["fieldRef"]["fieldPath"]])
    env["K0S_FLEET_CONFIG"] = str(config)
    # Several test processes share this host: the status port must not collide.
    env["K0S_FLEET_STATUS__PORT"] = str(free_port())
    cmd = [sys.executable, "-m", "fleet.cli", *c["args"], "--kubeconfig", str(kubeconfig)]
    return cmd, {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(scope="module")
async def installed(crds_installed: World, mgmt: KubeClient,
                    tmp_path_factory: pytest.TempPathFactory) -> ControllerInstall:
    await ensure_infra_crd(mgmt)
    capi_ns = unique("capi-rbac")
    await create_namespace(mgmt, capi_ns)
    return await install_controller(
        crds_installed["mgmt"], mgmt, tmp_path_factory.mktemp("controller-chart"),
        chart_values(capi_ns), namespace=unique("kf-rbac"), capi_namespace=capi_ns)


@pytest.fixture(scope="module")
async def controller_token(mgmt: KubeClient, installed: ControllerInstall) -> str:
    return await service_account_token(mgmt, installed.namespace, installed.service_account)


async def run_controller(inst: ControllerInstall, server: ApiServer, token: str,
                         directory: Path, *, task_status: anyio.abc.TaskStatus[Path]
                         = anyio.TASK_STATUS_IGNORED) -> None:
    """``k0s-fleet controller`` as the Deployment runs it, until cancelled."""
    kubeconfig = directory / "controller.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(server.kubeconfig(token=token, user="k0s-fleet")))
    config = directory / "fleet.yaml"
    config.write_text(inst.fleet_yaml)
    log = directory / "controller.log"
    cmd, env = deployment_command(inst, f"{inst.release}-7d9f8-abcde", kubeconfig, config)
    with log.open("wb") as out:
        proc = await anyio.open_process(cmd, stdout=out, stderr=out, env=env,
                                        cwd=str(REPO_ROOT), start_new_session=True)
    try:
        task_status.started(log)
        await proc.wait()
        raise AssertionError(f"controller exited {proc.returncode}:\n{_tail(log)}")
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.terminate()
                with anyio.move_on_after(10):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def _tail(log: Path | None, chars: int = 4000) -> str:
    return log.read_text()[-chars:] if log and log.exists() else ""


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str,
                   log: Path | None = None) -> None:
    try:
        with anyio.fail_after(timeout):
            while not await check():
                await anyio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}\n{_tail(log)}") from None


async def test_controller_upgrades_with_the_chart_identity(  # noqa: PLR0917 - fixtures
        crds_installed: World, mgmt: KubeClient, wl1: KubeClient,
        installed: ControllerInstall, controller_token: str, tmp_path: Path) -> None:
    ns = installed.capi_namespace
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=ns,
                              name=unique("rb"), control_planes=1, workers=2,
                              max_unavailable=1)
    responder = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in fc.machines)
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        log = await tg.start(run_controller, installed, crds_installed["mgmt"],
                             controller_token, tmp_path)

        async def leading() -> bool:
            lease = await mgmt.get_or_none(LEASES, "k0s-fleet-controller", installed.namespace)
            return bool(lease and lease["spec"].get("holderIdentity", "").startswith(
                installed.release))

        await wait_for(leading, 30, "the Lease", log)
        # The upgrade intent: the controller writes the KCP and MD versions itself (and
        # pauses them while it rolls them), under the chart's RBAC and guard policy.
        name = unique("to-v2")
        await apply_upgrade(mgmt, namespace=installed.namespace, name=name, version=V2,
                            selector=None)

        async def done() -> bool:
            plans = [p for p in (await mgmt.list(NODE_PLANS, ns)).items
                     if p["spec"]["clusterName"] == fc.name]
            machines = {m["metadata"]["name"]: m for m in (await mgmt.list(MACHINES, ns)).items}
            fu = await mgmt.get(FLEET_UPGRADES, name, installed.namespace)
            md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, ns)  # type: ignore[arg-type]
            return (len(plans) == len(fc.machines)
                    and all((p.get("status") or {}).get("phase") == NodePlanPhase.COMPLETED
                            for p in plans)
                    and all(machines[m]["spec"]["version"] == V2 for m in fc.machines)
                    and (fu.get("status") or {}).get("phase") == "Complete"
                    and "cluster.x-k8s.io/paused" not in (md["metadata"].get("annotations")
                                                          or {}))

        await wait_for(done, 120, "the upgrade", log)
        tg.cancel_scope.cancel()
    text = _tail(log, 10**7)
    assert "403" not in text and "Forbidden" not in text and "forbidden" not in text, text[-3000:]


@pytest.fixture
async def as_controller(crds_installed: World, controller_token: str
                        ) -> AsyncIterator[KubeClient]:
    async with await crds_installed["mgmt"].client(token=controller_token) as c:
        yield c


async def test_controller_is_refused_what_it_must_not_do(
        crds_installed: World, mgmt: KubeClient, wl1: KubeClient,
        installed: ControllerInstall, as_controller: KubeClient) -> None:
    ns, own = installed.capi_namespace, installed.namespace
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=ns,
                              name=unique("deny"), control_planes=1, workers=1,
                              max_unavailable=1)
    elsewhere = unique("not-fleet")
    await create_namespace(mgmt, elsewhere)
    await mgmt.create(SECRETS, {"metadata": {"name": "s"}, "stringData": {"k": "v"}}, elsewhere)
    ctl = as_controller
    worker, cp = fc.workers[0], fc.control_planes[0]
    assert fc.md is not None and fc.kcp is not None
    md, kcp = fc.md, fc.kcp

    # What it does (all allowed): watch, patch versions/annotations/status, own NodePlans.
    await ctl.list(MACHINES, ns)
    await ctl.list(SECRETS, ns)  # the kubeconfig Secrets, by list+watch
    await ctl.list(FLEET_UPGRADES, own)
    await ctl.patch(MACHINES, worker, {"spec": {"version": V2}}, ns)
    # The one writer of versions: KCP spec.version, MD/MS spec.template.spec.version.
    await ctl.patch(K0S_CONTROL_PLANES, kcp, {"spec": {"version": V2}}, ns)
    await ctl.patch(MACHINE_DEPLOYMENTS, md, {"spec": {"template": {"spec": {
        "version": V2}}}}, ns)
    assert fc.machine_set is not None
    await ctl.patch(MACHINE_SETS, fc.machine_set, {"spec": {"template": {"spec": {
        "version": V2}}}}, ns)
    await ctl.patch(MACHINES, worker, {"metadata": {"annotations": {"x": "y"}}}, ns)
    await ctl.patch(MACHINE_DEPLOYMENTS, md, {"metadata": {"annotations": {"x": "y"}}}, ns)
    await ctl.patch(K0S_CONTROL_PLANES, kcp, {"metadata": {"annotations": {"x": "y"}}}, ns)
    await ctl.patch(MACHINE_DEPLOYMENTS, md, {"status": {"k0sFleet": {"summary": "0/1"}}}, ns,
                    subresource="status")

    label = {"metadata": {"labels": {"x": "y"}}}
    by_rbac: dict[str, Callable[[], Awaitable[Any]]] = {
        "delete Machine": lambda: ctl.delete(MACHINES, worker, ns),
        "create Machine": lambda: ctl.create(MACHINES, {"metadata": {"name": "m"}, "spec": {
            "clusterName": fc.name}}, ns),
        "delete NodePlan": lambda: ctl.delete(NODE_PLANS, "any", ns),
        "get Secret": lambda: ctl.get(SECRETS, f"{fc.name}-kubeconfig", ns),
        "list Secrets elsewhere": lambda: ctl.list(SECRETS, elsewhere),
        "list Secrets cluster-wide": lambda: ctl.list(SECRETS),
        "list Machines elsewhere": lambda: ctl.list(MACHINES, elsewhere),
        "list Machines cluster-wide": lambda: ctl.list(MACHINES),
        "get another Lease": lambda: ctl.get(LEASES, "kube-scheduler", own),
        "update another Lease": lambda: ctl.patch(LEASES, "other", label, own),
        "create a Lease elsewhere": lambda: ctl.create(LEASES, {"metadata": {"name": "l"},
                                                               "spec": {}}, elsewhere),
        "read its own chart ConfigMap": lambda: ctl.get(CONFIGMAPS, installed.release, own),
        "list ConfigMaps": lambda: ctl.list(CONFIGMAPS, own),
        "list Nodes": lambda: ctl.list(NODES),
        "list Pods": lambda: ctl.list(PODS, ns),
        "list ExtensionConfigs (extension off)": lambda: ctl.list(EXTENSION_CONFIGS),
        "create a FleetUpgrade": lambda: ctl.create(FLEET_UPGRADES, upgrade_object(
            "evil", own, V2, None), own),
        "change a FleetUpgrade's spec": lambda: ctl.patch(FLEET_UPGRADES, "any", {
            "spec": {"version": V2}}, own),
        "delete a FleetUpgrade": lambda: ctl.delete(FLEET_UPGRADES, "any", own),
        "list FleetUpgrades elsewhere": lambda: ctl.list(FLEET_UPGRADES, ns),
        "bind itself cluster-admin": lambda: ctl.create(CLUSTER_ROLE_BINDINGS, {
            "metadata": {"name": unique("escalate")},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": installed.service_account,
                          "namespace": own}]}),
    }
    # patch is allowed by RBAC; the chart's guard policy refuses these changes
    by_guard: dict[str, Callable[[], Awaitable[Any]]] = {
        "scale a MachineDeployment": lambda: ctl.patch(MACHINE_DEPLOYMENTS, md,
                                                       {"spec": {"replicas": 5}}, ns),
        "re-template a MachineDeployment": lambda: ctl.patch(MACHINE_DEPLOYMENTS, md, {
            "spec": {"template": {"spec": {"infrastructureRef": {"name": "evil"}}}}}, ns),
        "change a K0sControlPlane spec": lambda: ctl.patch(K0S_CONTROL_PLANES, kcp, {
            "spec": {"k0sConfigSpec": {"args": ["--evil"]}}}, ns),
        "change a Machine's bootstrap": lambda: ctl.patch(MACHINES, worker, {"spec": {
            "bootstrap": {"configRef": {"name": "evil"}}}}, ns),
        "relabel a Machine": lambda: ctl.patch(MACHINES, cp, label, ns),
        "re-own a Machine": lambda: ctl.patch(MACHINES, worker, {"metadata": {
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x",
                                 "uid": "00000000-0000-0000-0000-000000000000"}]}}, ns),
        "add a finalizer to a MachineDeployment": lambda: ctl.patch(
            MACHINE_DEPLOYMENTS, md, {"metadata": {"finalizers": ["evil/x"]}}, ns),
        "scale a MachineSet": lambda: ctl.patch(MACHINE_SETS, fc.machine_set,  # type: ignore[arg-type]
                                                {"spec": {"replicas": 5}}, ns),
        "re-template a MachineSet": lambda: ctl.patch(MACHINE_SETS, fc.machine_set, {  # type: ignore[arg-type]
            "spec": {"template": {"spec": {"bootstrap": {"configRef": {"name": "evil"}}}}}},
            ns),
        "relabel a MachineDeployment's Machines": lambda: ctl.patch(
            MACHINE_DEPLOYMENTS, md, {"spec": {"template": {"metadata": {
                "labels": {"evil": "x"}}}}}, ns),
    }
    allowed, wrong_reason = [], []
    for refuser, calls in (("RBAC", by_rbac), ("guard", by_guard)):
        for what, call in calls.items():
            try:
                await call()
            except ForbiddenError as e:
                if (refuser == "guard") != ("k0s-fleet controller may not" in str(e)):
                    wrong_reason.append(f"{what}: {e}")
                continue
            allowed.append(what)
    assert allowed == []
    assert wrong_reason == []
    # ... and the objects are as they were.
    assert (await mgmt.get(MACHINE_DEPLOYMENTS, md, ns))["spec"]["replicas"] == 1
    assert (await mgmt.get(MACHINES, worker, ns))["metadata"].get("ownerReferences") is None
