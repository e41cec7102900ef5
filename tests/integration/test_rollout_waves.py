"""Fleet rollout on real API servers: waves, soak, canary halt, windows, pause, plan.

A small fleet on the real test world, and a coarse stand-in for controller + agents.

Clusters are real CAPI objects in ``mgmt`` (Cluster, kubeconfig Secret, MachineDeployment,
MachineSet, Machines) whose Nodes live on the workload API servers ``wl1`` / ``wl2``. The
upgrade is asked for with a FleetUpgrade; k0s-fleet writes each MachineDeployment's
version itself (paused) when the gate admits its cluster.

``RolloutDriver.step`` is one controller pass exactly as the rollout wiring does it:
observe the fleet (real API), ``RolloutCoordinator.decide`` (the real gate, the real
rollout ConfigMap, real Events), the real planner called with the gate's ``hold``, and
its dispatches and version writes are performed (NodePlans created, versions written by
the controller's Dispatcher). The node side is a
stand-in: the test completes or fails NodePlans by writing their status and the Node's
running-version annotation, the way the agent + NodePlan reconciler end up. The clock is
injected: nothing sleeps.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleet.contract.nodeplan import nodeplan_name
from fleet.events import EventRecorder, list_events
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
)
from fleet.rollout.annotations import ANN_PAUSED, ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.observe import observe
from fleet.rollout.plan import dry_run, plan_document
from fleet.rollout.state import RolloutState
from fleet.testing.world import World
from fleet.world.model import (
    ANN_CAPI_PAUSED,
    ANN_PAUSED_FOR,
    ANN_WRITTEN_VERSION,
    ObjectRef,
    parse_time,
)
from tests.helpers.waves import (
    CANARY,
    PROD,
    T0,
    TARGET,
    WAVES,
    RolloutDriver,
    ask_for,
    fleet_config,
    make_cluster,
)


def nodeplan_for(machine: str, version: str = TARGET) -> str:
    return nodeplan_name(machine, version)


# -- tests ------------------------------------------------------------------------------



async def _events(mgmt: KubeClient, namespace: str) -> list[dict[str, Any]]:
    return await list_events(mgmt, namespace)


def _reasons(events: list[dict[str, Any]], name: str | None = None) -> list[str]:
    return [e["reason"] for e in events if name is None or e["regarding"]["name"] == name]


@pytest.mark.anyio
async def test_waves_in_order_with_soak_and_plan_matches_the_rollout(
        world: World, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient,
        namespace: str) -> None:
    clusters = [
        await make_cluster(mgmt, world["wl1"], wl1, namespace, "can", labels=CANARY),
        await make_cluster(mgmt, world["wl2"], wl2, namespace, "p1", labels=PROD),
        await make_cluster(mgmt, world["wl1"], wl1, namespace, "p2", labels=PROD, workers=1),
    ]
    config = fleet_config(namespace, waves=WAVES)
    await ask_for(mgmt, namespace)
    # The dry run first: it must write nothing.
    planned = plan_document(dry_run(await observe(mgmt, config, now=T0), config, now=T0))
    assert await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace) is None
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []
    assert [w["name"] for w in planned["waves"]] == ["canary", "prod", "default"]
    md = planned["waves"][1]["clusters"][0]["objects"][0]
    assert md["inPlace"] == clusters[1].machines and md["clusterAPI"] == []
    assert planned["estimatedDuration"] is not None

    driver = RolloutDriver(mgmt, config, clusters)
    await driver.run_until_done()
    await driver.settle()  # the passes after the last node: versions moved, pauses released

    # The rollout did what the plan said, node by node.
    actual = [(f"{d.cluster[0]}/{d.cluster[1]}", d.node) for d in driver.dispatched]
    expected = [(s["cluster"], n) for s in planned["steps"] for n in s["nodes"]]
    assert len(actual) == 5
    assert actual == expected
    # Wave order, one cluster at a time, and the canary soak from the durable record.
    waves = [d.wave for d in driver.dispatched]
    assert waves == sorted(waves, key=["canary", "prod"].index)
    cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
    state = RolloutState.from_json(cm["data"][STATE_KEY])
    canary_done = state.waves["canary"].completed_at
    assert canary_done is not None
    first_prod = min(d.at for d in driver.dispatched if d.wave == "prod")
    assert first_prod >= canary_done + timedelta(minutes=30)
    assert first_prod - canary_done < timedelta(minutes=32)  # woke up on time
    for d in driver.decisions:
        upgrading = [g for g in d.clusters.values() if g.phase.value == "Upgrading"]
        assert len([g for g in upgrading if g.wave == "prod"]) <= 1
    assert state.admitted == {}
    # Events for humans, each once.
    events = await _events(mgmt, namespace)
    assert _reasons(events, ROLLOUT_CONFIGMAP).count("WaveStarted") == 2
    assert _reasons(events, ROLLOUT_CONFIGMAP).count("WaveCompleted") >= 2
    for c in clusters:
        assert _reasons(events, c.name) == ["UpgradeAdmitted", "UpgradeCompleted"]
    ev = next(e for e in events if e["reason"] == "UpgradeAdmitted")
    assert ev["reportingController"] == "fleet.k0s-fleet.io/controller"
    assert ev["regarding"]["kind"] == "Cluster" and ev["action"] == "Rollout"
    # k0s-fleet wrote every MachineDeployment's version itself, each only once its wave
    # admitted the cluster (a prod MD stayed on the old version through the canary soak),
    # and released its pause with every Machine and the MachineSet on the target.
    for c in clusters:
        written = [e for e in events if e["reason"] == "VersionWritten"
                   and e["regarding"]["name"] == f"{c.name}-md"]
        assert len(written) == 1, written
        first = min(d.at for d in driver.dispatched if d.cluster == c.key)
        at = parse_time(written[0]["eventTime"])
        assert at is not None and at <= first
        if c.name != "can":
            assert at >= canary_done + timedelta(minutes=30)
        md_obj = await mgmt.get(MACHINE_DEPLOYMENTS, f"{c.name}-md", namespace)
        anns = md_obj["metadata"].get("annotations") or {}
        assert md_obj["spec"]["template"]["spec"]["version"] == TARGET
        assert anns.get(ANN_WRITTEN_VERSION) == TARGET
        assert ANN_CAPI_PAUSED not in anns and ANN_PAUSED_FOR not in anns
        ms = await mgmt.get(MACHINE_SETS, f"{c.name}-ms", namespace)
        assert ms["spec"]["template"]["spec"]["version"] == TARGET
        for m in c.machines:
            assert (await mgmt.get(MACHINES, m, namespace))["spec"]["version"] == TARGET


@pytest.mark.anyio
async def test_a_canary_failure_halts_everything(
        world: World, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient,
        namespace: str) -> None:
    clusters = [
        await make_cluster(mgmt, world["wl1"], wl1, namespace, "can1", labels=CANARY),
        await make_cluster(mgmt, world["wl2"], wl2, namespace, "can2", labels=CANARY),
        await make_cluster(mgmt, world["wl2"], wl2, namespace, "p1", labels=PROD),
    ]
    waves = [{**WAVES[0], "maxConcurrentClusters": 2}, WAVES[1]]
    config = fleet_config(namespace, waves=waves)
    await ask_for(mgmt, namespace)
    driver = RolloutDriver(mgmt, config, clusters)
    d = await driver.settle()
    assert d.allowed_clusters == {(namespace, "can1"), (namespace, "can2")}
    first = {x.node for x in driver.dispatched}
    assert first == {clusters[0].machines[0], clusters[1].machines[0]}
    plans = {p["spec"]["nodeName"]: p for p in await driver.in_flight()}
    driver.now += timedelta(minutes=1)
    await driver.finish(plans[clusters[0].machines[0]], fail=True)
    await driver.finish(plans[clusters[1].machines[0]])
    for _ in range(3):
        d = await driver.settle()
        driver.now += timedelta(minutes=1)
        assert d.halted is not None and "canary" in d.halted
        assert d.allowed_clusters == frozenset()
    assert len(driver.dispatched) == 2  # nothing new anywhere
    events = await _events(mgmt, namespace)
    halted = [e for e in events if e["reason"] == "RolloutHalted"]
    assert len(halted) == 1 and halted[0]["type"] == "Warning"
    assert clusters[0].name in halted[0]["note"]
    # The operator clears the failure (deletes the NodePlan): the rollout resumes.
    failed = nodeplan_for(clusters[0].machines[0])
    await mgmt.delete(NODE_PLANS, failed, namespace)
    d = await driver.settle()
    assert d.halted is None
    assert (namespace, "can1") in d.allowed_clusters
    assert "RolloutHaltCleared" in _reasons(await _events(mgmt, namespace))


@pytest.mark.anyio
async def test_windows_and_pause_resume_mid_wave(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    clusters = [await make_cluster(mgmt, world["wl1"], wl1, namespace, "w1", workers=3)]
    config = fleet_config(namespace, maintenanceWindows=[
        {"schedule": "0 22 * * *", "duration": "1h", "timeZone": "UTC"}])
    await ask_for(mgmt, namespace)
    driver = RolloutDriver(mgmt, config, clusters)
    d = await driver.settle()  # 12:00: the window is closed
    assert driver.dispatched == []
    assert "outside its maintenance window" in d.reasons[(namespace, "w1")]
    assert d.next_wakeup == T0.replace(hour=22)
    driver.now = d.next_wakeup
    await driver.settle()
    assert [x.node for x in driver.dispatched] == clusters[0].machines[:1]
    # Pause mid-wave (fleet level, annotation on the rollout ConfigMap).
    await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"metadata": {"annotations": {
        ANN_PAUSED: "change freeze"}}}, namespace)
    driver.now += timedelta(minutes=5)
    await driver.finish_all()  # the node in flight finishes
    d = await driver.settle()
    assert d.paused is not None and "change freeze" in d.paused
    assert len(driver.dispatched) == 1
    # Resume: the next node starts.
    await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"metadata": {"annotations": {
        ANN_PAUSED: None}}}, namespace)
    driver.now += timedelta(minutes=1)
    await driver.settle()
    assert [x.node for x in driver.dispatched] == clusters[0].machines[:2]
    # Object-level pause on the MachineDeployment holds just that object.
    await mgmt.patch(MACHINE_DEPLOYMENTS, "w1-md", {"metadata": {"annotations": {
        ANN_PAUSED: "db migration"}}}, namespace)
    driver.now += timedelta(minutes=1)
    await driver.finish_all()
    d = await driver.settle()
    assert len(driver.dispatched) == 2
    assert "db migration" in (d.held_objects.get(ObjectRef("MachineDeployment", namespace,
                                                           "w1-md")) or "")
    await mgmt.patch(MACHINE_DEPLOYMENTS, "w1-md", {"metadata": {"annotations": {
        ANN_PAUSED: None}}}, namespace)
    # 23:08: the window has closed; in-flight work is done, nothing new starts.
    driver.now = T0.replace(hour=23, minute=8)
    d = await driver.settle()
    assert len(driver.dispatched) == 2
    assert d.next_wakeup == T0.replace(hour=22) + timedelta(days=1)
    driver.now = d.next_wakeup
    await driver.settle()
    assert [x.node for x in driver.dispatched] == clusters[0].machines
    reasons = _reasons(await _events(mgmt, namespace))
    for r in ("RolloutPaused", "RolloutResumed", "ObjectPaused", "ObjectResumed"):
        assert r in reasons, r


@pytest.mark.anyio
async def test_cluster_pause_annotation_and_restart_keep_the_admission(
        world: World, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient,
        namespace: str) -> None:
    clusters = [
        await make_cluster(mgmt, world["wl1"], wl1, namespace, "a"),
        await make_cluster(mgmt, world["wl2"], wl2, namespace, "b"),
    ]
    await mgmt.patch(CLUSTERS, "a", {"metadata": {"annotations": {ANN_PAUSED: "on call"}}},
                     namespace)
    config = fleet_config(namespace, maxConcurrentClusters=1)
    await ask_for(mgmt, namespace)
    driver = RolloutDriver(mgmt, config, clusters)
    d = await driver.settle()
    assert d.allowed_clusters == {(namespace, "b")}
    # (once b holds the one slot, that is the first reason a waits for)
    assert "on call" in driver.decisions[0].reasons[(namespace, "a")]
    assert [x.node for x in driver.dispatched] == clusters[1].machines[:1]
    # A "restarted controller" (fresh coordinator) still counts b's slot, even though it
    # sees no NodePlan of b yet (simulated by deleting it): the admission is durable.
    await mgmt.delete(NODE_PLANS, nodeplan_for(clusters[1].machines[0]), namespace)
    await mgmt.patch(CLUSTERS, "a", {"metadata": {"annotations": {ANN_PAUSED: None}}},
                     namespace)
    restarted = RolloutDriver(mgmt, config, clusters, now=driver.now + timedelta(minutes=1))
    d = await restarted.settle()
    assert d.allowed_clusters == {(namespace, "b")}
    assert "maxConcurrentClusters 1 clusters upgrading" in d.reasons[(namespace, "a")]
    reasons = _reasons(await _events(mgmt, namespace), "a")
    assert "ClusterPaused" in reasons


@pytest.mark.anyio
async def test_events_are_deduplicated(mgmt: KubeClient, namespace: str) -> None:
    cluster = await mgmt.create(CLUSTERS, {"metadata": {"name": "ev", "namespace": namespace},
                                           "spec": {"paused": False}})
    rec = EventRecorder(mgmt, instance="t1", clock=lambda: T0)
    assert await rec.emit(cluster, reason="Tested", action="Test", note="hello")
    assert not await rec.emit(cluster, reason="Tested", action="Test", note="hello")
    # Another process (restart, second replica) with an empty cache: still once.
    other = EventRecorder(mgmt, instance="t2", clock=lambda: T0)
    assert not await other.emit(cluster, reason="Tested", action="Test", note="hello")
    assert await other.emit(cluster, reason="Tested", action="Test", note="hello", key="2")
    events = await list_events(mgmt, namespace, regarding_name="ev")
    assert len(events) == 2
    e = next(x for x in events if x["reportingInstance"] == "t1")
    assert e["regarding"]["uid"] == cluster["metadata"]["uid"]
    assert e["regarding"]["apiVersion"] == "cluster.x-k8s.io/v1beta2"
    assert e["reportingInstance"] == "t1" and e["type"] == "Normal"
