"""k0s's version skew policy on the FleetUpgrade path, on real API servers: a version two
minors ahead is climbed one minor at a time (the ladder), and one that cannot be climbed
(a missing rung) or is a downgrade is refused before anything is written, with a condition,
a per-cluster status, a Warning Event and a non-zero `k0s-fleet upgrade` exit. An
independent watcher checks the skew rules at every Machine event."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from fleet.cli.exit import Exit
from fleet.cli.upgrade import apply_upgrade, follow
from fleet.config.models import FleetConfig
from fleet.events import list_events
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
)
from fleet.testing.capi import ensure_infra_crd
from fleet.testing.k0smotron import (
    HostedControlPlaneStandIn,
    K0smotronStandIn,
    register_control_nodes,
)
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from fleet.world.model import ANN_WRITTEN_VERSION
from tests.helpers.capienv import wait_for
from tests.helpers.controller import Lines, intent_config, policy_controller, small_cluster
from tests.helpers.skew import FleetSkewWatcher, SkewWatcher

V1 = "v1.31.2+k0s.0"
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def infra_crd(mgmt: KubeClient) -> None:
    await ensure_infra_crd(mgmt)


@pytest.mark.parametrize(("version", "rule"), [("v1.33.0+k0s.0", "MissingRung"),
                                               ("v1.30.9+k0s.0", "NoDowngrade")])
async def test_an_upgrade_k0s_does_not_support_is_refused_before_any_write(  # noqa: PLR0917
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None, namespace: str,
        version: str, rule: str) -> None:
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="skew", control_planes=1,
                             workers=1)
    assert fc.kcp is not None and fc.md is not None
    name = f"to-{rule.lower()}"
    obj = await apply_upgrade(mgmt, namespace=namespace, name=name, version=version,
                              selector=None)
    async with policy_controller(mgmt, intent_config(namespace)):
        out = Lines()
        with anyio.fail_after(60):
            rc = await follow(mgmt, namespace=namespace, name=name,
                              generation=obj["metadata"]["generation"], out=out, poll=0.1)
        assert rc == Exit.FAILED
        assert rule in out.lines[-1] and "version skew" in out.lines[-1], out.lines

        async def event() -> bool:
            return any(e.get("reason") == rule and e.get("type") == "Warning"
                       and (e.get("regarding") or {}).get("name") == name
                       for e in await list_events(mgmt, namespace))

        await wait_for("the Warning Event", event, 30, 0.05)
    st = (await mgmt.get(FLEET_UPGRADES, name, namespace))["status"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Refused"]["status"] == "True" and conds["Refused"]["reason"] == rule
    [entry] = st["clusters"]
    assert entry["phase"] == "Refused" and entry["refusedBy"] == rule
    # Nothing was written: no NodePlan, the versions as they were.
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)
    assert kcp["spec"]["version"] == V1
    assert md["spec"]["template"]["spec"]["version"] == V1
    for o in (kcp, md):
        assert (o["metadata"].get("annotations") or {}).get(ANN_WRITTEN_VERSION) in (None, V1)


async def test_a_fleet_upgrade_two_minors_ahead_climbs_one_minor_at_a_time(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="ladder", control_planes=1,
                             workers=2)
    base = intent_config(namespace).model_dump(mode="json", by_alias=True)
    base["download"]["releases"] = ["v1.32.0+k0s.0", "v1.32.5+k0s.0", "v1.34.0+k0s.0"]
    cfg = FleetConfig.model_validate(base)
    target = "v1.33.1+k0s.0"
    watcher = SkewWatcher(fc.name)
    # k0smotron able to act (its ControlNodes old enough, the KCP Available): only its pause
    # keeps it out of the way
    standin = K0smotronStandIn(mgmt, namespace, wl1, create_plans=False,
                               control_node_min_age=0.0)
    await register_control_nodes(wl1, fc.control_planes)
    responder = NodeResponder(wl1, step_seconds=0.1, only=lambda n: n in fc.machines)
    obj = await apply_upgrade(mgmt, namespace=namespace, name="ladder", version=target,
                              selector=None)
    rungs_seen: set[str] = set()
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run, mgmt, namespace)
        await tg.start(standin.run)
        await tg.start(responder.run)
        async with policy_controller(mgmt, cfg):
            async def on_the_rung() -> bool:
                st = (await mgmt.get(FLEET_UPGRADES, "ladder", namespace)).get("status") or {}
                for c in st.get("clusters") or []:
                    if c.get("rung"):
                        rungs_seen.add(c["rung"])
                return "v1.32.5+k0s.0" in rungs_seen

            await wait_for("the first rung in the status", on_the_rung, 60, 0.05)
            out = Lines()
            with anyio.fail_after(240):
                rc = await follow(mgmt, namespace=namespace, name="ladder",
                                  generation=obj["metadata"]["generation"], out=out, poll=0.2)
            assert rc == Exit.OK, out.lines

            async def told() -> list[str] | None:  # `kubectl describe` tells the story
                reasons = [e.get("reason") for e in await list_events(
                    mgmt, namespace, regarding_name="ladder")
                    if (e.get("regarding") or {}).get("kind") == "FleetUpgrade"]
                return reasons if {"Progressing", "Complete"} <= set(reasons) else None

            await wait_for("the FleetUpgrade's phase Events", told, 30, 0.1)

            # Complete is judged on what the nodes run; the control plane's Machine
            # version follows in the next pass (as k0smotron writes it after the node):
            # under load that write can still be on its way when Complete is seen
            async def machines_on_target() -> bool:
                await watcher.poll(mgmt, namespace)
                return {v for _, v in watcher.versions.values()} == {target}

            await wait_for("every Machine's version on the target", machines_on_target, 30,
                           0.1)
        tg.cancel_scope.cancel()
    for m in (await mgmt.list(MACHINES, namespace)).items:
        watcher.observe(m)
    assert watcher.violations == [], watcher.violations[:5]
    assert {v for _, v in watcher.versions.values()} == {target}
    plans = [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
             if p["spec"]["clusterName"] == fc.name]
    # every node went through the rung, then the target: two NodePlans each
    assert sorted(p["spec"]["version"] for p in plans) == sorted(
        ["v1.32.5+k0s.0"] * len(fc.machines) + [target] * len(fc.machines))
    assert standin.sightings == [], standin.sightings[:3]
    assert fc.kcp is not None
    able = standin.able
    await standin.reconcile(fc.kcp)  # unpaused at the end: it could act, finds nothing
    assert standin.able == able + 1 and standin.sightings == [], standin.waits


async def test_two_clusters_in_waves_one_hosted_climb_two_minors_within_the_skew_rules(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """Issue #30's proof on the test world: v1.30 -> v1.32 over two clusters in two waves,
    one with k0smotron's hosted control plane (its stand-in). The hosted version is the
    cluster's control-plane step; its workers wait for k0smotron to report it with every
    replica ready; every rung completes before the next; an independent watcher checks the
    skew rules at every change; the run ends on v1.32 everywhere."""
    old, rung, target = "v1.30.9+k0s.0", "v1.31.5+k0s.0", "v1.32.1+k0s.0"
    a = await small_cluster(mgmt, wl1, world, namespace, prefix="wa", control_planes=1,
                            workers=2, version=old)
    b = await small_cluster(mgmt, wl1, world, namespace, prefix="wb", control_planes=0,
                            workers=2, version=old)
    await mgmt.patch(CLUSTERS, a.name, {"metadata": {"labels": {"ring": "canary"}}}, namespace)
    hosted = f"{b.name}-hcp"
    await mgmt.create(K0SMOTRON_CONTROL_PLANES, {
        "apiVersion": K0SMOTRON_CONTROL_PLANES.api_version,
        "kind": K0SMOTRON_CONTROL_PLANES.kind,
        "metadata": {"name": hosted, "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": b.name}},
        "spec": {"version": old, "replicas": 2}}, namespace)
    await mgmt.patch(K0SMOTRON_CONTROL_PLANES, hosted,
                     {"status": {"version": old, "replicas": 2, "readyReplicas": 2}},
                     namespace, subresource="status")
    base = intent_config(namespace).model_dump(mode="json", by_alias=True)
    base["download"]["releases"] = [rung, "v1.31.2+k0s.0"]
    base["rollout"]["waves"] = [{"name": "canary", "canary": True, "soakSeconds": "1s",
                                 "clusterSelector": {"matchLabels": {"ring": "canary"}}}]
    cfg = FleetConfig.model_validate(base)
    watcher = FleetSkewWatcher([a.name, b.name])
    k0smotron = K0smotronStandIn(mgmt, namespace, wl1, create_plans=False,
                                 control_node_min_age=0.0)
    await register_control_nodes(wl1, a.control_planes)
    hosted_standin = HostedControlPlaneStandIn(mgmt, namespace, step_seconds=0.2)
    machines = set(a.machines) | set(b.machines)
    responder = NodeResponder(wl1, step_seconds=0.1, only=lambda n: n in machines)
    obj = await apply_upgrade(mgmt, namespace=namespace, name="two-minors", version=target,
                              selector=None)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run, mgmt, namespace)
        await tg.start(k0smotron.run)
        await tg.start(hosted_standin.run)
        await tg.start(responder.run)
        async with policy_controller(mgmt, cfg):
            out = Lines()
            try:
                with anyio.fail_after(300):
                    rc = await follow(mgmt, namespace=namespace, name="two-minors",
                                      generation=obj["metadata"]["generation"], out=out,
                                      poll=0.2)
            except TimeoutError:
                raise AssertionError(f"not complete: {out.lines[-3:]}") from None
            assert rc == Exit.OK, out.lines[-5:]
        tg.cancel_scope.cancel()
    for m in (await mgmt.list(MACHINES, namespace)).items:
        watcher.observe(m)
    assert watcher.violations == [], watcher.violations[:5]
    versions = {name: v for w in watcher.per_cluster.values()
                for name, (_, v) in w.versions.items()}
    assert set(versions.values()) == {target}, versions
    assert set(versions) >= machines | {hosted}
    # k0smotron rolled the hosted control plane once per rung, and no worker of its
    # cluster started a rung before it reported that rung with every replica ready
    assert hosted_standin.rolled == [(hosted, rung), (hosted, target)]
    plans = (await mgmt.list(NODE_PLANS, namespace)).items
    b_plans = sorted(p["spec"]["version"] for p in plans if p["spec"]["clusterName"] == b.name)
    assert b_plans == sorted([rung] * 2 + [target] * 2)
    assert k0smotron.sightings == []
    assert a.kcp is not None
    able = k0smotron.able
    await k0smotron.reconcile(a.kcp)  # unpaused at the end: it could act, finds nothing
    assert k0smotron.able == able + 1 and k0smotron.sightings == [], k0smotron.waits


async def test_an_upgrade_that_selects_no_cluster_ends_at_once(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """Issue #30 "no silent stalls": a selector that matches no cluster ended `k0s-fleet
    upgrade` only after its six-hour timeout; now at once, non-zero, saying why."""
    await small_cluster(mgmt, wl1, world, namespace, prefix="none", control_planes=0,
                        workers=1)
    obj = await apply_upgrade(mgmt, namespace=namespace, name="nobody", version="v1.31.3",
                              selector={"matchLabels": {"ring": "does-not-exist"}})
    async with policy_controller(mgmt, intent_config(namespace)):
        out = Lines()
        with anyio.fail_after(60):
            rc = await follow(mgmt, namespace=namespace, name="nobody",
                              generation=obj["metadata"]["generation"], out=out, poll=0.1)
    assert rc == Exit.FAILED
    assert "selects no cluster" in out.lines[-1] or "no cluster" in out.lines[-1], out.lines


async def test_a_deleted_fleet_upgrade_withdraws_what_it_had_not_started_and_shows_it(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    """Issue #30 "withdrawing a version says what it does": deleting a FleetUpgrade
    mid-rollout used to leave nothing to look at while its started cluster went on. Now
    the FleetUpgrade stays (k0s-fleet's finalizer), shows Withdrawing with the cluster
    still finishing the version already written into it, admits no other cluster, and
    goes once that cluster is done."""
    v2 = "v1.31.3+k0s.0"
    first = await small_cluster(mgmt, wl1, world, namespace, prefix="wd1", control_planes=1,
                                workers=1)
    second = await small_cluster(mgmt, wl1, world, namespace, prefix="wd2", control_planes=1,
                                 workers=1)
    machines = set(first.machines) | set(second.machines)
    await apply_upgrade(mgmt, namespace=namespace, name="withdrawn", version=v2,
                        selector=None)
    cfg = intent_config(namespace)  # maxConcurrentClusters 1
    async with policy_controller(mgmt, cfg), anyio.create_task_group() as tg:
        async def started() -> bool:
            plans = (await mgmt.list(NODE_PLANS, namespace)).items
            fu = await mgmt.get(FLEET_UPGRADES, "withdrawn", namespace)
            return bool(plans) and "fleet.k0s-fleet.io/withdraw" in (
                fu["metadata"].get("finalizers") or [])

        await wait_for("a cluster started, the FleetUpgrade held", started, 60, 0.05)
        [plan] = (await mgmt.list(NODE_PLANS, namespace)).items
        begun = plan["spec"]["clusterName"]
        other = second if begun == first.name else first
        await mgmt.delete(FLEET_UPGRADES, "withdrawn", namespace)

        async def withdrawing() -> dict[str, Any] | None:
            fu = await mgmt.get_or_none(FLEET_UPGRADES, "withdrawn", namespace)
            st = (fu or {}).get("status") or {}
            return st if st.get("phase") == "Withdrawing" else None

        st = await wait_for("Withdrawing", withdrawing, 60, 0.05)
        assert [c["name"] for c in st["clusters"]] == [begun], st
        assert "no new cluster is admitted" in st["message"]
        responder = NodeResponder(wl1, step_seconds=0.1, only=lambda n: n in machines)
        await tg.start(responder.run)

        async def gone() -> bool:
            return await mgmt.get_or_none(FLEET_UPGRADES, "withdrawn", namespace) is None

        await wait_for("the FleetUpgrade released", gone, 120, 0.1)

        async def recorded() -> bool:  # every node ran it; the Machines' records follow
            ms = (await mgmt.list(MACHINES, namespace)).items
            return {m["spec"]["version"] for m in ms
                    if m["spec"]["clusterName"] == begun} == {v2}

        await wait_for("the started cluster on the version", recorded, 60, 0.1)
        tg.cancel_scope.cancel()
    ms = (await mgmt.list(MACHINES, namespace)).items
    assert {m["spec"]["version"] for m in ms if m["spec"]["clusterName"] == begun} == {v2}
    assert {m["spec"]["version"] for m in ms
            if m["spec"]["clusterName"] == other.name} == {V1}
    assert [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
            if p["spec"]["clusterName"] == other.name] == []
    assert other.kcp is not None
    kcp = await mgmt.get(K0S_CONTROL_PLANES, other.kcp, namespace)
    assert kcp["spec"]["version"] == V1
