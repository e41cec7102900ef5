"""One upgrade intent, one writer of versions, on real API servers.

A FleetUpgrade drives the controller (with its rollout policy attached, as the entry
point does): it writes the K0sControlPlane's and MachineDeployment's versions itself,
pausing each while its nodes are upgraded in place. Beside it runs the k0smotron stand-in
(fleet/testing/k0smotron.py: k0smotron's documented KCP rules),
which records every moment it finds an unpaused KCP with an out-of-date Machine, i.e.
the moment real k0smotron would start a rollout of its own. The node side is the
scripted responder.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from fleet.cli.upgrade import apply_upgrade, follow
from fleet.contract.nodeplan import NodePlanPhase
from fleet.events import list_events
from fleet.kube import ForbiddenError, KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    Resource,
)
from fleet.planner import conditions as C
from fleet.testing.capi import FleetCluster, create_cluster, ensure_infra_crd
from fleet.testing.k0smotron import K0smotronStandIn, register_control_nodes
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from fleet.world.intent import COND_COMPLETE
from fleet.world.model import ANN_CAPI_PAUSED, ANN_PAUSED_FOR, ANN_WRITTEN_VERSION
from tests.helpers.capienv import wait_for
from tests.helpers.controller import (
    InvariantWatcher,
    Lines,
    intent_config,
    policy_controller,
    small_cluster,
)
from tests.helpers.names import unique

V1, V2, V3 = "v1.31.2+k0s.0", "v1.31.3+k0s.0", "v1.32.0+k0s.0"
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def infra_crd(mgmt: KubeClient) -> None:
    await ensure_infra_crd(mgmt)


def _ann(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


async def test_an_intent_upgrades_control_planes_paused_and_survives_a_controller_kill(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="fu", control_planes=3,
                             workers=2)
    assert fc.kcp is not None and fc.md is not None
    cfg = intent_config(namespace)
    # k0smotron able to act (its ControlNodes old enough, the KCP Available): only its pause
    # keeps it out of the way.
    standin = K0smotronStandIn(mgmt, namespace, wl1, create_plans=False,
                               control_node_min_age=0.0)
    await register_control_nodes(wl1, fc.control_planes)
    watcher = InvariantWatcher(fc, max_unavailable=1, cp_target=V2)
    responder = NodeResponder(wl1, step_seconds=0.2, only=lambda n: n in fc.machines)
    async with anyio.create_task_group() as tg:
        await tg.start(standin.run)
        await tg.start(watcher.run, mgmt, wl1)
        await tg.start(responder.run)
        obj = await apply_upgrade(mgmt, namespace=namespace, name="to-v2", version=V2,
                                  selector=None)

        async def one_cp_done_while_paused() -> bool:
            kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)  # type: ignore[arg-type]
            done = [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
                    if p["spec"]["role"] == "controller"
                    and (p.get("status") or {}).get("phase") == NodePlanPhase.COMPLETED]
            return ANN_CAPI_PAUSED in _ann(kcp) and len(done) >= 1

        async with policy_controller(mgmt, cfg):
            await wait_for("a control plane done, KCP paused", one_cp_done_while_paused, 90,
                           0.05)
        # The controller is gone mid-rollout: the pause, and k0s-fleet's record of it, stay.
        kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
        assert kcp["spec"]["version"] == V2
        assert _ann(kcp).get(ANN_PAUSED_FOR) == V2 and ANN_CAPI_PAUSED in _ann(kcp)
        md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)
        assert md["spec"]["template"]["spec"]["version"] == V1  # control planes first

        # A new controller resumes, finishes and releases the pause.
        async with policy_controller(mgmt, cfg):
            out = Lines()
            with anyio.fail_after(180):
                rc = await follow(mgmt, namespace=namespace, name="to-v2",
                                  generation=obj["metadata"]["generation"], out=out, poll=0.2)
            assert rc == 0, out.lines

            async def released() -> bool:
                # Each object's pause is released by its own write: the MachineSet's may
                # land after the MachineDeployment's (a fresh-clone CI stopped the
                # controller in between and found the MachineSet still paused).
                objs = [await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace),  # type: ignore[arg-type]
                        await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace),  # type: ignore[arg-type]
                        await mgmt.get(MACHINE_SETS, fc.machine_set, namespace)]  # type: ignore[arg-type]
                return all(ANN_CAPI_PAUSED not in _ann(o) for o in objs)

            await wait_for("pauses released", released, 60, 0.05)
        tg.cancel_scope.cancel()

    assert standin.sightings == [], standin.sightings[:3]
    assert standin.paused_seen > 0  # it did look while k0s-fleet held the KCP paused
    able = standin.able
    await standin.reconcile(fc.kcp)  # unpaused at the end: it could act, finds nothing
    assert standin.able == able + 1 and standin.sightings == [], standin.waits
    assert watcher.violations == [], watcher.violations[:5]
    assert watcher.max_seen_cp == 1
    machines = (await mgmt.list(MACHINES, namespace)).items
    assert {m["spec"]["version"] for m in machines if m["spec"]["clusterName"] == fc.name} \
        == {V2}
    ms = await mgmt.get(MACHINE_SETS, fc.machine_set, namespace)  # type: ignore[arg-type]
    assert ms["spec"]["template"]["spec"]["version"] == V2
    assert ANN_CAPI_PAUSED not in _ann(ms) and ANN_PAUSED_FOR not in _ann(ms)
    for res, name in ((K0S_CONTROL_PLANES, fc.kcp), (MACHINE_DEPLOYMENTS, fc.md)):
        o = await mgmt.get(res, name, namespace)
        assert _ann(o).get(ANN_WRITTEN_VERSION) == V2 and ANN_PAUSED_FOR not in _ann(o)
    fu = await mgmt.get(FLEET_UPGRADES, "to-v2", namespace)
    st = fu["status"]
    assert st["phase"] == "Complete" and st["summary"] == "1/1"
    assert st["clusters"][0]["name"] == fc.name and st["clusters"][0]["nodes"] == "5/5"
    assert any(c["type"] == COND_COMPLETE and c["status"] == "True" for c in st["conditions"])
    # k0smotron's K0sControlPlane CRD has a structural status (the stand-in's too): the
    # controller's status.k0sFleet counts are pruned there; the summary lives in the
    # K0sFleetUpToDate condition (and per cluster in the FleetUpgrade's status above).
    kcp_status = (await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace))["status"]
    assert "k0sFleet" not in kcp_status
    up = next(c for c in kcp_status["conditions"] if c["type"] == C.UP_TO_DATE)
    assert up["status"] == "True" and up["message"].startswith(f"3/3 machines on {V2}"), up
    # Every control plane was upgraded exactly once (no second NodePlan, no autopilot Plan).
    plans = [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
             if p["spec"]["clusterName"] == fc.name]
    assert sorted(p["spec"]["machineName"] for p in plans) == sorted(fc.machines)
    assert standin.plans_created == []


@pytest.mark.parametrize("intent", [True, False], ids=["fleet-upgrade", "no-fleet-upgrade"])
@pytest.mark.parametrize("kind", ["MachineDeployment", "K0sControlPlane"])
async def test_a_direct_version_bump_of_an_enrolled_object_is_reported_not_raced(  # noqa: PLR0917
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None, namespace: str,
        kind: str, intent: bool) -> None:
    """Every object of a fleet cluster is enrolled: with a FleetUpgrade covering it, or
    none (adopted at first sight), a version written by hand is reported, never raced."""
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="fu", control_planes=1,
                             workers=2)
    assert fc.kcp is not None and fc.md is not None
    res, name = ((MACHINE_DEPLOYMENTS, fc.md) if kind == "MachineDeployment"
                 else (K0S_CONTROL_PLANES, fc.kcp))
    cfg = intent_config(namespace)
    if intent:
        # An intent for the version the cluster already runs: moves nothing.
        await apply_upgrade(mgmt, namespace=namespace, name="hold-v1", version=V1,
                            selector=None)
    async with policy_controller(mgmt, cfg) as ctl:
        async def enrolled() -> bool:
            o = await mgmt.get(res, name, namespace)
            return _ann(o).get(ANN_WRITTEN_VERSION) == V1

        await wait_for("enrolment", enrolled, 60, 0.05)
        patch = ({"spec": {"template": {"spec": {"version": V3}}}} if res is MACHINE_DEPLOYMENTS
                 else {"spec": {"version": V3}})
        await mgmt.patch(res, name, patch, namespace)

        async def reported() -> bool:
            o = await mgmt.get(res, name, namespace)
            return any(c.get("type") == C.VERSION_WRITER and c.get("status") == "False"
                       and c.get("reason") == C.R_CHANGED_BY_OTHER
                       for c in (o.get("status") or {}).get("conditions") or [])

        await wait_for("the conflict condition", reported, 60, 0.05)
        passes = ctl.stats.passes

        async def more_passes() -> bool:
            ctl.trigger.poke()
            return ctl.stats.passes >= passes + 3

        await wait_for("three more passes", more_passes, 30, 0.05)

        async def event() -> bool:
            evs = await list_events(mgmt, namespace)
            return any(e.get("reason") == "VersionChangedByOther"
                       and (e.get("regarding") or {}).get("name") == name for e in evs)

        await wait_for("the Warning Event", event, 30, 0.05)
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []  # no node started
    o = await mgmt.get(res, name, namespace)
    assert ANN_CAPI_PAUSED not in _ann(o)  # and nothing of k0s-fleet's was written on it
    version = (o["spec"]["template"]["spec"]["version"] if res is MACHINE_DEPLOYMENTS
               else o["spec"]["version"])
    assert version == V3 and _ann(o).get(ANN_WRITTEN_VERSION) == V1


async def test_the_worker_template_follows_the_md_and_a_hand_edit_of_it_is_reported(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """k0smotron installs a K0sWorkerConfigTemplate's version on every new worker Machine.
    Kept in step with the MD, the controller adopts it with the MD and writes each version
    into it right after the MD's; someone else's edit of it is reported like one of the
    MD's version (condition on the MD, Warning Event) and the MD is neither written nor
    are its nodes started until it is set back."""
    kept = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(), namespace=namespace,
                                name=unique("tk"), control_planes=0, workers=2,
                                max_unavailable=1, version=V1, worker_template_version=V1)
    edited = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(), namespace=namespace,
                                  name=unique("te"), control_planes=0, workers=2,
                                  max_unavailable=1, version=V1, worker_template_version=V1)
    for fc in (kept, edited):
        await mgmt.patch(CLUSTERS, fc.name, {"metadata": {"labels": {"ring": fc.name}}},
                         namespace)
    # The first cluster is asked for V2, the second held at V1 (adopted, nothing moves).
    await apply_upgrade(mgmt, namespace=namespace, name="hold", version=V1,
                        selector={"matchLabels": {"ring": edited.name}})
    await apply_upgrade(mgmt, namespace=namespace, name="kept", version=V2,
                        selector={"matchLabels": {"ring": kept.name}})

    async def template(fc: FleetCluster) -> dict[str, Any]:
        return await mgmt.get(K0S_WORKER_CONFIG_TEMPLATES, f"{fc.name}-w", namespace)

    cfg = intent_config(namespace)
    # (no node completes here: both clusters may be in flight at once)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"max_concurrent_clusters": 2})})
    async with policy_controller(mgmt, cfg):
        async def written() -> bool:
            md = await mgmt.get(MACHINE_DEPLOYMENTS, kept.md or "", namespace)
            tpl = await template(kept)
            return (md["spec"]["template"]["spec"]["version"] == V2
                    and tpl["spec"]["template"]["spec"]["version"] == V2
                    and _ann(tpl).get(ANN_WRITTEN_VERSION) == V2)

        await wait_for("the MD's and the template's versions written", written, timeout=60)

        async def adopted() -> bool:
            return _ann(await template(edited)).get(ANN_WRITTEN_VERSION) == V1

        await wait_for("the held cluster's template adopted", adopted, timeout=60)
        await mgmt.patch(K0S_WORKER_CONFIG_TEMPLATES, f"{edited.name}-w", {"spec": {
            "template": {"spec": {"version": V3}}}}, namespace)
        # Now asked for V2: the MD is not written while its template is in conflict.
        await apply_upgrade(mgmt, namespace=namespace, name="hold", version=V2,
                            selector={"matchLabels": {"ring": edited.name}})

        async def reported() -> bool:
            md = await mgmt.get(MACHINE_DEPLOYMENTS, edited.md or "", namespace)
            return any(c.get("type") == C.VERSION_WRITER and c.get("status") == "False"
                       and c.get("reason") == C.R_CHANGED_BY_OTHER
                       and "K0sWorkerConfigTemplate" in c.get("message", "")
                       for c in (md.get("status") or {}).get("conditions") or [])

        await wait_for("the conflict condition on the MD", reported, timeout=60)

        async def event() -> bool:
            return any(e.get("reason") == "VersionChangedByOther"
                       and (e.get("regarding") or {}).get("name") == edited.md
                       for e in await list_events(mgmt, namespace))

        await wait_for("the Warning Event", event, timeout=30)
        md = await mgmt.get(MACHINE_DEPLOYMENTS, edited.md or "", namespace)
        assert md["spec"]["template"]["spec"]["version"] == V1
        assert (await template(edited))["spec"]["template"]["spec"]["version"] == V3
        assert not [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
                    if p["spec"]["clusterName"] == edited.name]
        # Set back: the MD and then its template are written.
        await mgmt.patch(K0S_WORKER_CONFIG_TEMPLATES, f"{edited.name}-w", {"spec": {
            "template": {"spec": {"version": V1}}}}, namespace)

        async def caught_up() -> bool:
            md = await mgmt.get(MACHINE_DEPLOYMENTS, edited.md or "", namespace)
            tpl = await template(edited)
            return (md["spec"]["template"]["spec"]["version"] == V2
                    and tpl["spec"]["template"]["spec"]["version"] == V2)

        await wait_for("the held cluster written once set back", caught_up, timeout=60)


async def test_a_worker_template_two_mds_share_is_left_alone_with_the_reason(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """Two clusters' MachineDeployments reference one K0sWorkerConfigTemplate (counted
    fleet-wide, across the per-cluster parts): k0s-fleet writes both MDs' versions and
    never that template's (neither its version nor its record), and says why on each MD."""
    first = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(), namespace=namespace,
                                 name=unique("ts"), control_planes=0, workers=1,
                                 max_unavailable=1, version=V1, worker_template_version=V1)
    second = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(), namespace=namespace,
                                  name=unique("ts"), control_planes=0, workers=1,
                                  max_unavailable=1, version=V1, worker_template_version=V1)
    shared = f"{first.name}-w"
    for res, name in ((MACHINE_DEPLOYMENTS, second.md), (MACHINE_SETS, second.machine_set)):
        obj = await mgmt.get(res, name or "", namespace)
        obj["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"] = shared
        await mgmt.replace(res, obj)
    await apply_upgrade(mgmt, namespace=namespace, name="all", version=V2, selector=None)
    cfg = intent_config(namespace)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"max_concurrent_clusters": 2})})
    async with policy_controller(mgmt, cfg):
        seen: dict[str, Any] = {}

        async def both_written() -> bool:
            for fc in (first, second):
                md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md or "", namespace)
                seen[fc.name] = (md["spec"]["template"]["spec"]["version"], _ann(md),
                                 (md.get("status") or {}).get("conditions"))
                if md["spec"]["template"]["spec"]["version"] != V2 or not any(
                        c.get("type") == C.VERSION_WRITER and c.get("status") == "True"
                        and f"{shared} is shared by 2 MachineDeployments" in c.get(
                            "message", "")
                        for c in (md.get("status") or {}).get("conditions") or []):
                    return False
            return True

        try:
            await wait_for("both MDs written, the shared template named", both_written,
                           timeout=90)
        except AssertionError as e:
            raise AssertionError(f"{e}; the MDs: {seen}") from None
    tpl = await mgmt.get(K0S_WORKER_CONFIG_TEMPLATES, shared, namespace)
    assert tpl["spec"]["template"]["spec"]["version"] == V1
    assert ANN_WRITTEN_VERSION not in _ann(tpl)
    # the second cluster's own template, referenced by no MD now, is not touched either
    own = await mgmt.get(K0S_WORKER_CONFIG_TEMPLATES, f"{second.name}-w", namespace)
    assert ANN_WRITTEN_VERSION not in _ann(own)


VAPS = Resource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
                "ValidatingAdmissionPolicy", namespaced=False)
VAP_BINDINGS = Resource("admissionregistration.k8s.io", "v1",
                        "validatingadmissionpolicybindings",
                        "ValidatingAdmissionPolicyBinding", namespaced=False)


async def test_the_opt_in_version_guard_refuses_other_writers(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """The chart's rbac.versionGuard policy, as rendered by helm, on the real API server
    (its binding narrowed to this test's namespace so that other tests are unaffected)."""
    from tests.helpers.charts import CONTROLLER_CHART, render  # noqa: PLC0415

    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="fu", control_planes=1,
                             workers=1)
    assert fc.md is not None and fc.kcp is not None
    m = render(CONTROLLER_CHART, sets=["rbac.versionGuard=true"], namespace="k0s-fleet-system")
    vap = next(p for p in m.all("ValidatingAdmissionPolicy")
               if p["metadata"]["name"].endswith("-version-guard"))
    binding = next(b for b in m.all("ValidatingAdmissionPolicyBinding")
                   if b["metadata"]["name"].endswith("-version-guard"))
    name = unique("version-guard")
    vap["metadata"] = {"name": name}
    binding["metadata"] = {"name": name}
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": namespace}}}
    await mgmt.create(VAPS, vap)
    await mgmt.create(VAP_BINDINGS, binding)
    try:
        # Enrolled (as the controller records it): other writers are refused the version.
        for res, obj in ((MACHINE_DEPLOYMENTS, fc.md), (K0S_CONTROL_PLANES, fc.kcp)):
            await mgmt.patch(res, obj, {"metadata": {"annotations": {
                ANN_WRITTEN_VERSION: V1}}}, namespace)
        bump_md = {"spec": {"template": {"spec": {"version": V2}}}}

        async def refused() -> bool:
            try:
                await mgmt.patch(MACHINE_DEPLOYMENTS, fc.md, bump_md, namespace)  # type: ignore[arg-type]
            except ForbiddenError as e:
                assert "FleetUpgrade" in str(e) and V2 in str(e), e
                return True
            # Not active yet (the policy takes a moment): undo, try again.
            undo = {"spec": {"template": {"spec": {"version": V1}}}}
            try:
                await mgmt.patch(MACHINE_DEPLOYMENTS, fc.md, undo, namespace)  # type: ignore[arg-type]
            except ForbiddenError:
                # It became active between the two writes: step out of enrolment to undo.
                for step in ({"metadata": {"annotations": {ANN_WRITTEN_VERSION: None}}}, undo,
                             {"metadata": {"annotations": {ANN_WRITTEN_VERSION: V1}}}):
                    await mgmt.patch(MACHINE_DEPLOYMENTS, fc.md, step, namespace)  # type: ignore[arg-type]
            return False

        await wait_for("the version guard to refuse", refused, 60, 0.05)
        with pytest.raises(ForbiddenError, match="FleetUpgrade"):
            await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"version": V2}}, namespace)
        # Everything else stays allowed: other spec fields, annotations, and objects that
        # k0s-fleet does not write the version of.
        await mgmt.patch(MACHINE_DEPLOYMENTS, fc.md, {"spec": {"replicas": 1}}, namespace)
        await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"metadata": {"annotations": {
            "x": "y"}}}, namespace)
        await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"metadata": {"annotations": {
            ANN_WRITTEN_VERSION: None}}}, namespace)
        await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"version": V2}}, namespace)
        md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)
        assert md["spec"]["template"]["spec"]["version"] == V1
    finally:
        await mgmt.delete(VAP_BINDINGS, name)
        await mgmt.delete(VAPS, name)
