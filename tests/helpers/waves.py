"""A rollout driven pass by pass on real API servers (gate + planner, scripted nodes).

The clusters start on :data:`OLD`, every object saying so; the upgrade is asked for as
the docs say (a FleetUpgrade, :func:`ask_for`) and k0s-fleet's planner writes the
versions itself: the driver performs the planner's version-writer and Machine actions with
the controller's real :class:`~fleet.controllers.dispatcher.Dispatcher`, and plays the
nodes by writing the NodePlans' status."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from opentelemetry import trace

from fleet.cli.upgrade import apply_upgrade
from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import build_nodeplan
from fleet.contract.signal import RUNNING_VERSION_KEY
from fleet.controllers.dispatcher import Dispatcher
from fleet.controllers.observe import ManagementView
from fleet.events import EventRecorder
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
    SECRETS,
)
from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import (
    AnnotateWorkerVersion,
    CreateNodePlan,
    PatchMachineSetVersion,
    PatchMachineVersion,
    PauseObject,
    RecordWrittenVersion,
    ReleasePause,
    ReportOtherDriver,
    ReportVersionConflict,
    WriteVersion,
)
from fleet.rollout.coordinator import RolloutCoordinator
from fleet.rollout.gate import GateDecision
from fleet.rollout.observe import observe
from fleet.rollout.progress import ClusterProgress, clusters_from_snapshot
from fleet.testing.world import ApiServer
from fleet.world.clusters import ClusterRegistry
from fleet.world.model import format_time
from fleet.world.reported import kubelet_version

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
                       max_unavailable: int = 1, version: str = OLD) -> FleetCluster:
    """A CAPI cluster with one MachineDeployment of ``workers`` Ready nodes, every object
    on ``version`` (a FleetUpgrade asks for another: :func:`ask_for`)."""
    suffix = uuid.uuid4().hex[:6]
    kubeconfig = yaml.safe_dump(server.kubeconfig())
    await mgmt.create(SECRETS, {
        "metadata": {"name": f"{name}-kubeconfig", "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/cluster-name": name}},
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": base64.b64encode(kubeconfig.encode()).decode()}})
    await mgmt.create(CLUSTERS, {"metadata": {"name": name, "namespace": namespace,
                                              "labels": labels or {}}, "spec": {"paused": False}})
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
                 "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": f"{name}-md"}},
                 "rollout": {"strategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": max_unavailable}}},
                 "template": template(version)}})
    await mgmt.create(MACHINE_SETS, {
        "metadata": {"name": f"{name}-ms", "namespace": namespace,
                     "labels": {"cluster.x-k8s.io/deployment-name": f"{name}-md"}},
        "spec": {"clusterName": name, "replicas": workers,
                 "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": f"{name}-md"}},
                 "template": template(version)}})
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
        # As a real node registers: no k0s-fleet annotation, the kubelet's version.
        await wl.create(NODES, {"metadata": {"name": m}})
        await wl.patch(NODES, m, {"status": {"nodeInfo": {
            "kubeletVersion": kubelet_version(version)}, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
    return FleetCluster(namespace, name, machines, wl)


async def ask_for(mgmt: KubeClient, namespace: str, version: str = TARGET, *,
                  name: str = "to-target", selector: dict[str, Any] | None = None) -> None:
    """Ask the fleet (or the clusters matching ``selector``) for ``version``, as the docs
    say: a FleetUpgrade in the controller's namespace (what ``k0s-fleet upgrade`` writes)."""
    await apply_upgrade(mgmt, namespace=namespace, name=name, version=version,
                        selector=selector)


def fleet_config(namespace: str, kubeconfig: str | None = None,
                 **rollout: Any) -> FleetConfig:
    return FleetConfig.model_validate({
        "management": {"namespace": namespace, "kubeconfig": kubeconfig},
        "clusters": {"namespaces": [namespace]},
        # no node downloads anything here (the nodes are scripted): without a digest the
        # skew rules would refuse the target before any write (fleet/contract/skew.py climb)
        "download": {"allowUnverified": True},
        "rollout": rollout,
    }, by_alias=True, by_name=False)


@dataclass
class Dispatch:
    at: datetime
    cluster: tuple[str, str]
    node: str
    wave: str


# What the driver performs with the controller's own Dispatcher: the one writer of versions
# and the Machine/MachineSet version moves. (NodePlans are created by the driver with a
# fixed download, and the node side is scripted: see :meth:`RolloutDriver.finish`.)
WRITER_ACTIONS = (RecordWrittenVersion, WriteVersion, PauseObject, ReleasePause,
                  PatchMachineVersion, PatchMachineSetVersion, AnnotateWorkerVersion,
                  ReportVersionConflict, ReportOtherDriver)


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
        # Never run: its caches stay empty, so every write reads the object fresh.
        view = ManagementView(self.mgmt)
        self.dispatcher = Dispatcher(
            mgmt=self.mgmt, view=view,
            registry=ClusterRegistry(view[SECRETS], on_change=lambda: None),
            config=self.config, recorder=self.recorder, tracer=trace.get_tracer(__name__),
            clock=lambda: self.now)

    @property
    def namespace(self) -> str:
        return self.config.management.namespace

    def cluster(self, name: str) -> FleetCluster:
        return next(c for c in self.clusters if c.name == name)

    async def step(self) -> GateDecision:
        obs = await observe(self.mgmt, self.config, now=self.now)
        self.progress = clusters_from_snapshot(obs.snapshot)
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
            elif isinstance(a, WRITER_ACTIONS):
                await self.dispatcher.perform(a)
        return decision

    async def settle(self, *, max_passes: int = 6) -> GateDecision:
        """Passes at the same moment until one writes nothing more: what the controller
        does on its own between two changes of the world (adopt an object's version, write
        the target, then start nodes)."""
        for _ in range(max_passes):
            writes, dispatched = self.dispatcher.stats.writes, len(self.dispatched)
            decision = await self.step()
            if self.dispatcher.stats.writes == writes and len(self.dispatched) == dispatched:
                return decision
        raise AssertionError(f"still writing after {max_passes} passes")

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
            writes = self.dispatcher.stats.writes
            decision = await self.step()
            if all(c.complete for c in self.progress):
                return
            finished = await self.finish_all()
            wrote = self.dispatcher.stats.writes > writes  # a version written, a pause...
            if not finished and not wrote and not decision.admitted_now and not any(
                    d.at == self.now for d in self.dispatched):
                assert decision.next_wakeup is not None, decision.reasons
                self.now = max(self.now + tick, decision.next_wakeup)
            else:
                self.now += tick
        raise AssertionError("the rollout did not finish")


CANARY = {"k0s-fleet.io/ring": "canary"}


PROD = {"k0s-fleet.io/ring": "prod"}


WAVES = [
    {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
     "maxConcurrentClusters": 1, "soakSeconds": "30m"},
    {"name": "prod", "clusterSelector": {"matchLabels": PROD}, "maxConcurrentClusters": 1},
]
