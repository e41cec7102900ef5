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

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from fleet.cli.upgrade import apply_upgrade, upgrade_object
from fleet.contract.nodeplan import NodePlanPhase
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
)
from fleet.testing.capi import create_cluster, ensure_infra_crd
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from tests.helpers.charts import (
    CLUSTER_ROLE_BINDINGS,
    create_namespace,
)
from tests.helpers.names import unique
from tests.helpers.rbac import (
    ControllerInstall,
    _tail,
    chart_values,
    install_controller,
    run_controller,
    service_account_token,
    wait_for,
)

pytestmark = pytest.mark.anyio

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
RBAC = "rbac.authorization.k8s.io"












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








async def test_controller_upgrades_with_the_chart_identity(  # noqa: PLR0917 - fixtures
        crds_installed: World, mgmt: KubeClient, wl1: KubeClient,
        installed: ControllerInstall, controller_token: str, tmp_path: Path) -> None:
    async def leading() -> bool:
        lease = await mgmt.get_or_none(LEASES, "k0s-fleet-controller", installed.namespace)
        return bool(lease and lease["spec"].get("holderIdentity", "").startswith(
            installed.release))

    await _upgrade_as_the_chart(crds_installed, mgmt, wl1, installed, controller_token,
                                tmp_path, leading)


async def test_sharded_controller_upgrades_with_the_chart_identity(
        crds_installed: World, mgmt: KubeClient, wl1: KubeClient, tmp_path: Path) -> None:
    """sharding.enabled: member Lease, shard claims and the writer Lease under the
    chart's Role (a second install: the Role differs)."""
    capi_ns = unique("capi-shard")
    await create_namespace(mgmt, capi_ns)
    values = chart_values(capi_ns)
    values["sharding"] = {"enabled": True, "shards": 4}
    (tmp_path / "chart").mkdir()
    inst = await install_controller(crds_installed["mgmt"], mgmt, tmp_path / "chart",
                                    values, namespace=unique("kf-shard"),
                                    capi_namespace=capi_ns)
    token = await service_account_token(mgmt, inst.namespace, inst.service_account)

    async def leading() -> bool:
        leases = (await mgmt.list(LEASES, inst.namespace)).items
        holders = {x["metadata"]["name"]: x["spec"].get("holderIdentity") or ""
                   for x in leases}
        return all(holders.get(f"k0s-fleet-controller-{n}", "").startswith(inst.release)
                   for n in ("writer", "shard-0", "shard-1", "shard-2", "shard-3"))

    await _upgrade_as_the_chart(crds_installed, mgmt, wl1, inst, token, tmp_path, leading)


async def _upgrade_as_the_chart(  # noqa: PLR0917
        crds_installed: World, mgmt: KubeClient, wl1: KubeClient,
        installed: ControllerInstall, controller_token: str, tmp_path: Path,
        leading: Callable[[], Awaitable[bool]]) -> None:
    ns = installed.capi_namespace
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=ns,
                              name=unique("rb"), control_planes=1, workers=2,
                              max_unavailable=1)
    responder = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in fc.machines)
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        log = await tg.start(run_controller, installed, crds_installed["mgmt"],
                             controller_token, tmp_path)
        await wait_for(leading, 60, "the Lease(s)", log)
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
    # A 403 as a word: the release's random name once read k0s-fleet-2cfa403d; nor a
    # number of the log's own (a garbage collection pause of 403 ms, 0.403 s, 403 objects).
    assert not re.search(r"(?<![.\d])\b403\b(?![.\d]|\s*(?:ms|s|objects)\b)|[Ff]orbidden",
                         text), text[-3000:]


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
    intent = unique("intent")
    await apply_upgrade(mgmt, namespace=own, name=intent, version=V2,
                        selector={"matchLabels": {"nobody": "x"}})
    # its own finalizer: allowed (and taken off again)
    await ctl.patch(FLEET_UPGRADES, intent, {"metadata": {
        "finalizers": ["fleet.k0s-fleet.io/withdraw"]}}, own)
    await ctl.patch(FLEET_UPGRADES, intent, {"metadata": {"finalizers": None}}, own)
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
    await ctl.patch(MACHINE_DEPLOYMENTS, md, {"status": {"conditions": [{
        "type": "K0sFleetUpToDate", "status": "False", "reason": "Waiting", "message": "0/1",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, ns, subresource="status")

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
        # patch on FleetUpgrades is for k0s-fleet's own finalizer (withdrawing) only
        "change a FleetUpgrade's spec": lambda: ctl.patch(FLEET_UPGRADES, intent, {
            "spec": {"version": V1}}, own),
        "add another finalizer to a FleetUpgrade": lambda: ctl.patch(
            FLEET_UPGRADES, intent, {"metadata": {"finalizers": ["evil/x"]}}, own),
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
