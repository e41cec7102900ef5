"""The test world's K0sControlPlane behaves as k0smotron v2.1.0 does (issue 34), on the
real API server: the stand-in CRD refuses and defaults what k0smotron's CRD and webhook
do, and the stand-in controller (fleet/testing/k0smotron.py) follows k0smotron's pause
rule, its gate (ControlNode age, Available), its "up to date", the endpoint it writes into
the KCP spec and its status.version that is not recomputed while paused. The last test is
k0s-fleet's side of that stale status.version: its extension's skew check must not take it
for what the control planes run.

Each test calls the stand-in's ``reconcile`` itself, so every assertion follows a
reconcile that has run to its end (no waiting on a background loop)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from fleet.cli.upgrade import apply_upgrade, follow
from fleet.events import list_events
from fleet.extension.admission import check_cluster_skew
from fleet.extension.update import UpdateMachineService
from fleet.kube import InvalidError, KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    CONTROL_NODES,
    K0S_CONTROL_PLANES,
    MACHINES,
    NODE_PLANS,
)
from fleet.planner import conditions as C
from fleet.testing.capi import (
    CONTROL_PLANE_ENDPOINT,
    K0S_CONFIG_SPEC,
    FleetCluster,
    create_cluster,
    ensure_infra_crd,
    infrastructure_template_ref,
)
from fleet.testing.k0smotron import K0smotronStandIn, register_control_nodes, version_matches
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from fleet.world.model import ANN_CAPI_PAUSED, ANN_WRITTEN_VERSION
from tests.helpers.capienv import wait_for
from tests.helpers.controller import Lines, intent_config, policy_controller
from tests.helpers.names import unique

V1, V2, V_NEXT_MINOR = "v1.31.2+k0s.0", "v1.31.3+k0s.0", "v1.32.0+k0s.0"
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def infra_crd(mgmt: KubeClient) -> None:
    await ensure_infra_crd(mgmt)


async def _cluster(mgmt: KubeClient, wl1: KubeClient, world: World, namespace: str, *,
                   workers: int = 0, control_nodes: bool = True) -> FleetCluster:
    fc = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(), namespace=namespace,
                              name=unique("kz"), control_planes=1, workers=workers,
                              max_unavailable=1, version=V1)
    if control_nodes:
        await register_control_nodes(wl1, fc.control_planes)
    return fc


def _standin(mgmt: KubeClient, wl1: KubeClient, namespace: str, **kw: Any) -> K0smotronStandIn:
    kw = {"control_node_min_age": 0.0, "status_lag_after_unpause": 0.0, **kw}
    return K0smotronStandIn(mgmt, namespace, wl1, create_plans=False, **kw)


def _kcp_body(name: str, k0s: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"args": ["--debug"]}
    if k0s is not None:
        config["k0s"] = k0s
    return {"metadata": {"name": name},
            "spec": {"version": V1, "machineTemplate": {
                "infrastructureRef": infrastructure_template_ref(name)},
                "k0sConfigSpec": config, **spec}}


async def test_the_stand_in_crd_refuses_and_defaults_as_k0smotron(
        mgmt: KubeClient, namespace: str) -> None:
    # k0smotron's webhook refuses a k0s config without its apiVersion and kind.
    for k0s in ({"spec": {"api": {"sans": ["10.0.0.1"]}}},
                {"apiVersion": "k0s.k0sproject.io/v1beta1", "spec": {}},
                {"kind": "ClusterConfig", "spec": {}}):
        with pytest.raises(InvalidError, match=r"k0s\.k0sproject\.io/v1beta1"):
            await mgmt.create(K0S_CONTROL_PLANES, _kcp_body(unique("bad"), k0s), namespace)
    # k0sConfigSpec and machineTemplate.infrastructureRef are required.
    body = _kcp_body(unique("bad"))
    del body["spec"]["machineTemplate"]
    with pytest.raises(InvalidError):
        await mgmt.create(K0S_CONTROL_PLANES, body, namespace)
    # A valid one is defaulted as k0smotron's CRD does; the infrastructureRef is an object
    # reference: Cluster API's apiGroup form is not part of it (pruned).
    name = unique("ok")
    body = _kcp_body(name, dict(K0S_CONFIG_SPEC["k0s"]))
    body["spec"]["machineTemplate"]["infrastructureRef"]["apiGroup"] = "ignored.example.com"
    kcp = await mgmt.create(K0S_CONTROL_PLANES, body, namespace)
    spec = kcp["spec"]
    assert (spec["replicas"], spec["updateStrategy"]) == (1, "InPlace")
    assert spec["k0sConfigSpec"]["k0sInstallDir"] == "/usr/local/bin"
    assert spec["machineTemplate"]["infrastructureRef"] == infrastructure_template_ref(name)


async def test_pause_is_the_kcp_annotation_or_the_cluster_spec_never_the_cluster_annotation(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    fc = await _cluster(mgmt, wl1, world, namespace)
    assert fc.kcp is not None
    standin = _standin(mgmt, wl1, namespace)
    await standin.reconcile(fc.kcp)
    assert standin.able == 1 and standin.sightings == [], standin.waits
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"version": V2}}, namespace)

    # Only the Cluster's annotation: k0smotron is not held.
    await mgmt.patch(CLUSTERS, fc.name, {"metadata": {"annotations": {ANN_CAPI_PAUSED: ""}}},
                     namespace)
    await standin.reconcile(fc.kcp)
    assert [s.out_of_date for s in standin.sightings] == [{fc.control_planes[0]: V1}]
    assert standin.plans_created[-1]["spec"]["commands"][0]["k0supdate"]["version"] == V2

    # The Cluster's spec.paused holds it, and so does the KCP's own annotation.
    for res, name, patch in (
            (CLUSTERS, fc.name, {"spec": {"paused": True}}),
            (K0S_CONTROL_PLANES, fc.kcp, {"metadata": {"annotations": {ANN_CAPI_PAUSED: ""}}})):
        await mgmt.patch(CLUSTERS, fc.name, {"spec": {"paused": False}}, namespace)
        await mgmt.patch(res, name, patch, namespace)
        paused, seen = standin.paused_seen, len(standin.sightings)
        await standin.reconcile(fc.kcp)
        assert (standin.paused_seen, len(standin.sightings)) == (paused + 1, seen), res.kind


async def test_nothing_happens_before_the_newest_control_node_is_old_enough_and_available(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    fc = await _cluster(mgmt, wl1, world, namespace, control_nodes=False)
    assert fc.kcp is not None
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"version": V2}}, namespace)
    cp = fc.control_planes[0]

    # No workload cluster to read: never Available, nothing done.
    blind = K0smotronStandIn(mgmt, namespace, None, create_plans=False)
    await blind.reconcile(fc.kcp)
    assert blind.sightings == [] and blind.able == 0
    assert blind.waits == [f"{fc.kcp}: not Available (workload API not reached)"]

    standin = _standin(mgmt, wl1, namespace, control_node_min_age=3600.0)
    await standin.reconcile(fc.kcp)
    assert standin.waits == [f"{fc.kcp}: no ControlNode {cp} yet"]
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    assert any(c["type"] == "Available" and c["status"] == "True"
               for c in kcp["status"]["conditions"])
    await register_control_nodes(wl1, [cp])
    await standin.reconcile(fc.kcp)
    assert standin.waits[-1].startswith(f"{fc.kcp}: ControlNode {cp} joined")
    assert standin.sightings == [] and standin.able == 0

    standin.control_node_min_age = 0.0  # the minute has passed
    await standin.reconcile(fc.kcp)
    assert standin.able == 1 and [s.kcp for s in standin.sightings] == [fc.kcp]
    await wl1.delete(CONTROL_NODES, cp)


async def test_it_needs_the_endpoint_and_writes_it_into_the_kcp_spec(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    fc = await _cluster(mgmt, wl1, world, namespace)
    assert fc.kcp is not None
    host = CONTROL_PLANE_ENDPOINT["host"]
    # create_cluster leaves the KCP as k0smotron does: the endpoint's host written in.
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    assert kcp["spec"]["k0sConfigSpec"]["k0s"]["spec"]["api"]["externalAddress"] == host
    standin = _standin(mgmt, wl1, namespace)

    # As a user applies it (no externalAddress): k0smotron writes it into the spec itself.
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"k0sConfigSpec": {"k0s": {
        "spec": {"api": {"externalAddress": None}}}}}}, namespace)
    await standin.reconcile(fc.kcp)
    assert standin.config_writes == [(fc.kcp, host)]
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    assert kcp["spec"]["k0sConfigSpec"]["k0s"]["spec"]["api"]["externalAddress"] == host
    assert standin.sightings == []  # a config k0smotron wrote itself is no change

    # Without the Cluster's endpoint it does nothing past its status.
    cluster = await mgmt.get(CLUSTERS, fc.name, namespace)
    del cluster["spec"]["controlPlaneEndpoint"]
    await mgmt.replace(CLUSTERS, cluster)
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"version": V2}}, namespace)
    await standin.reconcile(fc.kcp)
    assert standin.waits[-1] == f"{fc.kcp}: the Cluster's controlPlaneEndpoint is not set"
    assert standin.sightings == []


async def test_up_to_date_and_status_version_as_k0smotron_counts_them(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    assert version_matches("v1.31.2", V1) and version_matches("v1.31.2", "v1.31.2+k0s.1")
    assert not version_matches("v1.31.2+k0s.1", V1) and not version_matches(None, V1)
    fc = await _cluster(mgmt, wl1, world, namespace)
    assert fc.kcp is not None
    cp = fc.control_planes[0]
    standin = _standin(mgmt, wl1, namespace)
    # A Machine version without the +k0s.N suffix is on the KCP's version.
    await mgmt.patch(MACHINES, cp, {"spec": {"version": "v1.31.2"}}, namespace)
    await standin.reconcile(fc.kcp)
    assert standin.able == 1 and standin.sightings == []
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    assert kcp["status"]["version"] == V1  # the minimum, with the KCP's suffix

    # A changed bootstrap config makes it out of date (not an in-place update).
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"k0sConfigSpec": {
        "args": ["--enable-metrics-scraper", "--debug"]}}}, namespace)
    await standin.reconcile(fc.kcp)
    assert [(s.out_of_date, s.not_in_place) for s in standin.sightings] == [
        ({cp: "v1.31.2"}, (cp,))]
    assert standin.plans_created == []

    # Paused: status.version is not recomputed; unpaused: it is.
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"metadata": {"annotations": {
        ANN_CAPI_PAUSED: ""}}}, namespace)
    await mgmt.patch(MACHINES, cp, {"spec": {"version": V2}}, namespace)
    await standin.reconcile(fc.kcp)
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    assert kcp["status"]["version"] == V1
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"metadata": {"annotations": {
        ANN_CAPI_PAUSED: None}}}, namespace)
    await standin.reconcile(fc.kcp)
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    assert kcp["status"]["version"] == V2


async def test_the_extension_skew_check_does_not_take_a_stale_kcp_status_version(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """k0s-fleet's executor keeps the KCP paused while it moves the control planes to a new
    minor; k0smotron does not recompute status.version meanwhile (and lags after the
    unpause), so it still says the old minor when the workers' turn comes. The skew check
    of CanUpdateMachineSet / UpdateMachine counted it as a control plane on the old minor
    and refused the workers' move in place (CAPI then falls back to replacing Machines)."""
    fc = await _cluster(mgmt, wl1, world, namespace, workers=1)
    assert fc.kcp is not None
    standin = _standin(mgmt, wl1, namespace)
    await standin.reconcile(fc.kcp)  # k0smotron's status: V1 on every Machine
    # the paused executor's writes: the pause with the version, then each Machine's
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {
        "metadata": {"annotations": {ANN_CAPI_PAUSED: ""}},
        "spec": {"version": V_NEXT_MINOR}}, namespace)
    await mgmt.patch(MACHINES, fc.control_planes[0], {"spec": {"version": V_NEXT_MINOR}},
                     namespace)
    await standin.reconcile(fc.kcp)
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    assert kcp["status"]["version"] == V1  # stale, as k0smotron leaves it while paused

    service = UpdateMachineService(mgmt=mgmt)
    control_planes, workers = await service.cluster_versions(namespace, fc.name)
    refusal = check_cluster_skew("worker", V_NEXT_MINOR, control_planes, workers,
                                 what="workers")
    assert refusal is None, refusal
    assert V1 not in control_planes and V_NEXT_MINOR in control_planes, control_planes
    assert workers == [V1]


async def test_the_endpoint_k0smotron_writes_into_an_adopted_kcp_is_not_a_users_change(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """k0s-fleet adopts a KCP as the user applied it (no externalAddress); k0smotron then
    writes the Cluster's endpoint into the KCP's spec. k0s-fleet must take that for no
    change of the user's: the version record stays, nothing is reported, and a FleetUpgrade
    upgrades the control plane in place (paused) as usual. k0smotron's status.version, not
    recomputed while paused and late after the unpause (here held back 60 s), still says the
    old version when k0s-fleet reports the upgrade complete: k0s-fleet judges by the
    Machines and nodes, never by it."""
    fc = await _cluster(mgmt, wl1, world, namespace, workers=1)
    assert fc.kcp is not None
    kcp_name = fc.kcp
    await mgmt.patch(K0S_CONTROL_PLANES, kcp_name, {"spec": {"k0sConfigSpec": {"k0s": {
        "spec": {"api": {"externalAddress": None}}}}}}, namespace)
    standin = _standin(mgmt, wl1, namespace, status_lag_after_unpause=60.0)
    responder = NodeResponder(wl1, step_seconds=0.1, only=lambda n: n in fc.machines)
    async with policy_controller(mgmt, intent_config(namespace)), \
            anyio.create_task_group() as tg:
        async def adopted() -> bool:
            kcp = await mgmt.get(K0S_CONTROL_PLANES, kcp_name, namespace)
            return (kcp["metadata"].get("annotations") or {}).get(ANN_WRITTEN_VERSION) == V1

        await wait_for("the KCP adopted", adopted, 60, 0.05)
        await standin.reconcile(kcp_name)  # k0smotron writes the endpoint into the spec
        assert standin.config_writes == [(kcp_name, CONTROL_PLANE_ENDPOINT["host"])]
        await tg.start(standin.run)
        await tg.start(responder.run)
        obj = await apply_upgrade(mgmt, namespace=namespace, name=f"to-{fc.name}", version=V2,
                                  selector=None)
        out = Lines()
        with anyio.fail_after(120):
            rc = await follow(mgmt, namespace=namespace, name=f"to-{fc.name}",
                              generation=obj["metadata"]["generation"], out=out, poll=0.2)
        assert rc == 0, out.lines
        async def released() -> dict[str, Any] | None:
            kcp = await mgmt.get(K0S_CONTROL_PLANES, kcp_name, namespace)
            return None if ANN_CAPI_PAUSED in kcp["metadata"]["annotations"] else kcp

        kcp = await wait_for("k0s-fleet's pause released", released, 30, 0.05)
        assert kcp["status"]["version"] == V1  # k0smotron's, stale: no part of "complete"
        tg.cancel_scope.cancel()
    kcp = await mgmt.get(K0S_CONTROL_PLANES, kcp_name, namespace)
    assert kcp["metadata"]["annotations"][ANN_WRITTEN_VERSION] == V2
    conds = {c["type"]: c for c in kcp["status"]["conditions"]}
    assert conds[C.VERSION_WRITER]["status"] == "True", conds[C.VERSION_WRITER]
    events = await list_events(mgmt, namespace)
    assert [e for e in events if e["reason"] in (C.R_CHANGED_BY_OTHER, C.R_NOT_IN_PLACE)] == []
    plans = [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
             if p["spec"]["clusterName"] == fc.name]
    assert sorted(p["spec"]["machineName"] for p in plans) == sorted(fc.machines)
    assert standin.sightings == [] and standin.paused_seen > 0
