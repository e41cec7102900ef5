"""Fleet rollout on real API servers: waves, soak, canary halt, windows, pause, plan.

A small fleet on the real test world, and a coarse stand-in for controller + agents.

Clusters are real CAPI objects in ``mgmt`` (Cluster, kubeconfig Secret, MachineDeployment,
MachineSet, Machines) whose Nodes live on the workload API servers ``wl1`` / ``wl2``.

``RolloutDriver.step`` is one controller pass exactly as the rollout wiring does it:
observe the fleet (real API), ``RolloutCoordinator.decide`` (the real gate, the real
rollout ConfigMap, real Events), the real planner called with the gate's ``hold``, and
its dispatches are performed (NodePlans created). The node side is a
stand-in: the test completes or fails NodePlans by writing their status and the Node's
running-version annotation, the way the agent + NodePlan reconciler end up. The clock is
injected: nothing sleeps.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from fleet.config import FleetConfig
from fleet.events import EventRecorder, list_events
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
    SECRETS,
)
from fleet.model import ObjectRef, format_time
from fleet.nodeplan import build_nodeplan, nodeplan_name
from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import AnnotateWorkerVersion, CreateNodePlan
from fleet.rollout.annotations import ANN_PAUSED, ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.coordinator import RolloutCoordinator
from fleet.rollout.gate import GateDecision
from fleet.rollout.observe import observe
from fleet.rollout.plan import dry_run, plan_document
from fleet.rollout.progress import ClusterProgress, clusters_from_snapshot
from fleet.rollout.state import RolloutState
from fleet.signal import RUNNING_VERSION_KEY
from fleet.testing.world import ApiServer, World

OLD = "v1.31.2+k0s.0"
TARGET = "v1.31.3+k0s.0"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday, 12:00 UTC


@dataclass
class FleetCluster:
    namespace: str
    name: str
    machines: list[str]  # machine name == node name (unique per API server)
    wl: KubeClient

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


async def make_cluster(mgmt: KubeClient, server: ApiServer, wl: KubeClient, namespace: str,
                       name: str, *, labels: dict[str, str] | None = None, workers: int = 2,
                       max_unavailable: int = 1, version: str = OLD,
                       target: str = TARGET) -> FleetCluster:
    """A CAPI cluster with one MachineDeployment of ``workers`` Ready nodes on ``version``,
    bumped to ``target``."""
    suffix = uuid.uuid4().hex[:6]
    kubeconfig = yaml.safe_dump(server.kubeconfig())
    await mgmt.create(SECRETS, {
        "metadata": {"name": f"{name}-kubeconfig", "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": name}},
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": base64.b64encode(kubeconfig.encode()).decode()}})
    await mgmt.create(CLUSTERS, {"metadata": {"name": name, "namespace": namespace,
                                              "labels": labels or {}}, "spec": {}})
    boot = {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "K0sWorkerConfigTemplate",
            "name": f"{name}-w"}
    infra = {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachineTemplate",
             "name": f"{name}-w"}

    def template(v: str) -> dict[str, Any]:
        return {"spec": {"clusterName": name, "version": v,
                         "bootstrap": {"configRef": boot}, "infrastructureRef": infra}}

    await mgmt.create(MACHINE_DEPLOYMENTS, {
        "metadata": {"name": f"{name}-md", "namespace": namespace},
        "spec": {"clusterName": name, "replicas": workers,
                 "rollout": {"strategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": max_unavailable}}},
                 "template": template(target)}})
    await mgmt.create(MACHINE_SETS, {
        "metadata": {"name": f"{name}-ms", "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/deployment-name": f"{name}-md"}},
        "spec": {"clusterName": name, "replicas": workers, "template": template(version)}})
    machines = []
    for i in range(workers):
        m = f"{name}-{i}-{suffix}"
        machines.append(m)
        await mgmt.create(MACHINES, {
            "metadata": {"name": m, "namespace": namespace, "labels": {
                "cluster.x-k8s.io/cluster-name": name,
                "cluster.x-k8s.io/deployment-name": f"{name}-md",
                "cluster.x-k8s.io/set-name": f"{name}-ms"}},
            "spec": {"clusterName": name, "version": version,
                     "bootstrap": {"configRef": boot}, "infrastructureRef": infra}})
        await wl.create(NODES, {"metadata": {"name": m,
                                             "annotations": {RUNNING_VERSION_KEY: version}}})
        await wl.patch(NODES, m, {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
    return FleetCluster(namespace, name, machines, wl)


def fleet_config(namespace: str, kubeconfig: str | None = None,
                 **rollout: Any) -> FleetConfig:
    return FleetConfig.model_validate({
        "management": {"namespace": namespace, "kubeconfig": kubeconfig},
        "clusters": {"namespaces": [namespace]},
        "rollout": rollout,
    }, by_alias=True, by_name=False)


@dataclass
class Dispatch:
    at: datetime
    cluster: tuple[str, str]
    node: str
    wave: str


@dataclass
class RolloutDriver:
    mgmt: KubeClient
    config: FleetConfig
    clusters: list[FleetCluster]
    now: datetime = T0
    dispatched: list[Dispatch] = field(default_factory=list)
    decisions: list[GateDecision] = field(default_factory=list)
    progress: list[ClusterProgress] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.recorder = EventRecorder(self.mgmt, instance="test-driver",
                                      clock=lambda: self.now)
        self.coordinator = RolloutCoordinator(self.mgmt, self.config, recorder=self.recorder,
                                              clock=lambda: self.now)

    @property
    def namespace(self) -> str:
        return self.config.management.namespace

    def cluster(self, name: str) -> FleetCluster:
        return next(c for c in self.clusters if c.name == name)

    async def step(self) -> GateDecision:
        obs = await observe(self.mgmt, self.config, now=self.now)
        self.progress = clusters_from_snapshot(obs.snapshot, obs.meta)
        decision = await self.coordinator.decide(self.progress, self.now)
        self.decisions.append(decision)
        result = plan(obs.snapshot, PlannerSettings(), hold=decision.hold)
        for a in result.actions:
            if isinstance(a, CreateNodePlan):
                assert decision.hold(a.cluster, a.owner) is None
                machine = await self.mgmt.get(MACHINES, a.machine.name, a.machine.namespace)
                body = build_nodeplan(machine=machine, node_name=a.node, role=a.role,
                                      version=a.version, url="https://example.invalid/k0s",
                                      sha256="0" * 64, owner_kind=a.owner.kind,
                                      owner_name=a.owner.name)
                await self.mgmt.create(NODE_PLANS, body)
                self.dispatched.append(Dispatch(self.now, a.cluster, a.node,
                                                decision.clusters[a.cluster].wave))
            elif isinstance(a, AnnotateWorkerVersion):
                await self.mgmt.patch(MACHINES, a.machine.name, {"metadata": {"annotations": {
                    RUNNING_VERSION_KEY: a.version}}}, a.machine.namespace)
        return decision

    async def in_flight(self) -> list[dict[str, Any]]:
        plans = (await self.mgmt.list(NODE_PLANS, self.namespace)).items
        return [p for p in plans if (p.get("status") or {}).get("phase")
                not in ("Completed", "Failed")]

    async def finish(self, plan_obj: dict[str, Any], *, fail: bool = False) -> None:
        """The node side: the upgrade succeeded (node on target, Ready) or failed."""
        spec = plan_obj["spec"]
        name, ns = plan_obj["metadata"]["name"], plan_obj["metadata"]["namespace"]
        t = format_time(self.now)
        if fail:
            status = {"phase": "Failed", "nodeState": "FailedDownload", "startedAt": t,
                      "phaseSince": t, "message": "simulated failure", "conditions": [
                          {"type": "Failed", "status": "True", "reason": "NodeFailed",
                           "message": "simulated", "lastTransitionTime": t}]}
        else:
            status = {"phase": "Completed", "nodeState": "Completed", "startedAt": t,
                      "phaseSince": t, "completedAt": t, "runningVersion": spec["version"]}
            c = next(x for x in self.clusters if x.namespace == ns
                     and x.name == spec["clusterName"])
            await c.wl.patch(NODES, spec["nodeName"], {"metadata": {"annotations": {
                RUNNING_VERSION_KEY: spec["version"]}}})
        await self.mgmt.patch(NODE_PLANS, name, {"status": status}, ns, subresource="status")

    async def finish_all(self) -> int:
        plans = await self.in_flight()
        for p in plans:
            await self.finish(p)
        return len(plans)

    async def run_until_done(self, *, tick: timedelta = timedelta(minutes=1),
                             max_passes: int = 80) -> None:
        """Pass after pass: finish what is in flight, jump the clock to the gate's next
        wake-up when nothing moves, until every cluster is complete."""
        for _ in range(max_passes):
            decision = await self.step()
            if all(c.complete for c in self.progress):
                return
            finished = await self.finish_all()
            if not finished and not decision.admitted_now and not any(
                    d.at == self.now for d in self.dispatched):
                assert decision.next_wakeup is not None, decision.reasons
                self.now = max(self.now + tick, decision.next_wakeup)
            else:
                self.now += tick
        raise AssertionError("the rollout did not finish")


def nodeplan_for(machine: str, version: str = TARGET) -> str:
    return nodeplan_name(machine, version)


# -- tests ------------------------------------------------------------------------------

CANARY = {"k0s-fleet.io/ring": "canary"}
PROD = {"k0s-fleet.io/ring": "prod"}
WAVES = [
    {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
     "maxConcurrentClusters": 1, "soakSeconds": "30m"},
    {"name": "prod", "clusterSelector": {"matchLabels": PROD}, "maxConcurrentClusters": 1},
]


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
    driver = RolloutDriver(mgmt, config, clusters)
    d = await driver.step()
    assert d.allowed_clusters == {(namespace, "can1"), (namespace, "can2")}
    first = {x.node for x in driver.dispatched}
    assert first == {clusters[0].machines[0], clusters[1].machines[0]}
    plans = {p["spec"]["nodeName"]: p for p in await driver.in_flight()}
    driver.now += timedelta(minutes=1)
    await driver.finish(plans[clusters[0].machines[0]], fail=True)
    await driver.finish(plans[clusters[1].machines[0]])
    for _ in range(3):
        d = await driver.step()
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
    d = await driver.step()
    assert d.halted is None
    assert (namespace, "can1") in d.allowed_clusters
    assert "RolloutHaltCleared" in _reasons(await _events(mgmt, namespace))


@pytest.mark.anyio
async def test_windows_and_pause_resume_mid_wave(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    clusters = [await make_cluster(mgmt, world["wl1"], wl1, namespace, "w1", workers=3)]
    config = fleet_config(namespace, maintenanceWindows=[
        {"schedule": "0 22 * * *", "duration": "1h", "timeZone": "UTC"}])
    driver = RolloutDriver(mgmt, config, clusters)
    d = await driver.step()  # 12:00: the window is closed
    assert driver.dispatched == []
    assert "outside its maintenance window" in d.reasons[(namespace, "w1")]
    assert d.next_wakeup == T0.replace(hour=22)
    driver.now = d.next_wakeup
    await driver.step()
    assert [x.node for x in driver.dispatched] == clusters[0].machines[:1]
    # Pause mid-wave (fleet level, annotation on the rollout ConfigMap).
    await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"metadata": {"annotations": {
        ANN_PAUSED: "change freeze"}}}, namespace)
    driver.now += timedelta(minutes=5)
    await driver.finish_all()  # the node in flight finishes
    d = await driver.step()
    assert d.paused is not None and "change freeze" in d.paused
    assert len(driver.dispatched) == 1
    # Resume: the next node starts.
    await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP, {"metadata": {"annotations": {
        ANN_PAUSED: None}}}, namespace)
    driver.now += timedelta(minutes=1)
    await driver.step()
    assert [x.node for x in driver.dispatched] == clusters[0].machines[:2]
    # Object-level pause on the MachineDeployment holds just that object.
    await mgmt.patch(MACHINE_DEPLOYMENTS, "w1-md", {"metadata": {"annotations": {
        ANN_PAUSED: "db migration"}}}, namespace)
    driver.now += timedelta(minutes=1)
    await driver.finish_all()
    d = await driver.step()
    assert len(driver.dispatched) == 2
    assert "db migration" in (d.held_objects.get(ObjectRef("MachineDeployment", namespace,
                                                           "w1-md")) or "")
    await mgmt.patch(MACHINE_DEPLOYMENTS, "w1-md", {"metadata": {"annotations": {
        ANN_PAUSED: None}}}, namespace)
    # 23:08: the window has closed; in-flight work is done, nothing new starts.
    driver.now = T0.replace(hour=23, minute=8)
    d = await driver.step()
    assert len(driver.dispatched) == 2
    assert d.next_wakeup == T0.replace(hour=22) + timedelta(days=1)
    driver.now = d.next_wakeup
    await driver.step()
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
    driver = RolloutDriver(mgmt, config, clusters)
    d = await driver.step()
    assert d.allowed_clusters == {(namespace, "b")}
    assert "on call" in d.reasons[(namespace, "a")]
    # A "restarted controller" (fresh coordinator) still counts b's slot, even though it
    # sees no NodePlan of b yet (simulated by deleting it): the admission is durable.
    await mgmt.delete(NODE_PLANS, nodeplan_for(clusters[1].machines[0]), namespace)
    await mgmt.patch(CLUSTERS, "a", {"metadata": {"annotations": {ANN_PAUSED: None}}},
                     namespace)
    restarted = RolloutDriver(mgmt, config, clusters, now=driver.now + timedelta(minutes=1))
    d = await restarted.step()
    assert d.allowed_clusters == {(namespace, "b")}
    assert "1 of maxConcurrentClusters 1" in d.reasons[(namespace, "a")]
    reasons = _reasons(await _events(mgmt, namespace), "a")
    assert "ClusterPaused" in reasons


@pytest.mark.anyio
async def test_events_are_deduplicated(mgmt: KubeClient, namespace: str) -> None:
    cluster = await mgmt.create(CLUSTERS, {"metadata": {"name": "ev", "namespace": namespace},
                                           "spec": {}})
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
