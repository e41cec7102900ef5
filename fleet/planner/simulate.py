"""An in-memory fleet that performs planner actions the way the dispatcher does.

Used by the property tests (random fleets, states and event orders), and usable for
dry-run estimates: it plays the node side with a model of the agent's state machine.
Nothing here talks to an API server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from fleet.contract.nodeplan import NodePlanPhase, nodeplan_name
from fleet.contract.signal import (
    HAPPY_PATH,
    SIGNAL_VERSION,
    SignalState,
    SignalStatus,
    parse_signal,
)
from fleet.contract.skew import EMPTY_CATALOG, ReleaseCatalog
from fleet.planner.actions import (
    Action,
    AnnotateWorkerVersion,
    ClearSignal,
    CreateNodePlan,
    MarkNodePlanFailed,
    PatchMachineSetVersion,
    PatchMachineVersion,
    PauseObject,
    RecordWrittenVersion,
    ReleaseNodePlan,
    ReleasePause,
    RemoveAnnotation,
    RetryNodePlan,
    SetRolloutStatus,
    SignalNode,
    StartNodePlan,
    UncordonNode,
    UpdateNodePlanStatus,
    WriteVersion,
)
from fleet.planner.conditions import NP_FAILED, R_DEADLINE
from fleet.world.executors import executor
from fleet.world.intent import apply_intents
from fleet.world.model import (
    ANN_CAPI_PAUSED,
    ANN_K0S_CONFIG,
    ANN_MACHINE_RUNNING_VERSION,
    ANN_PAUSED_FOR,
    ANN_WRITTEN_VERSION,
    EXECUTOR_AUTOPILOT,
    KIND_KCP,
    KIND_MD,
    KIND_NODEPLAN,
    KIND_WORKER_TEMPLATE,
    NODEPLAN_FINALIZER,
    ROLE_CONTROLLER,
    ROLE_WORKER,
    ClusterInfo,
    ClusterKey,
    Condition,
    ControlPlaneInfo,
    FleetUpgradeInfo,
    InfraMachineInfo,
    MachineDeploymentInfo,
    MachineInfo,
    MachineSetInfo,
    NodeInfo,
    NodePlanInfo,
    ObjectRef,
    RolloutStatus,
    Snapshot,
    TemplateRef,
)
from fleet.world.reported import kubelet_version

AGENT = "sim-agent"

_O = TypeVar("_O", MachineDeploymentInfo, ControlPlaneInfo)


@dataclass
class SimFleet:
    """Mutable world; ``snapshot()`` freezes it for the planner."""

    now: datetime
    clusters: dict[ClusterKey, ClusterInfo] = field(default_factory=dict)
    deployments: dict[tuple[str, str], MachineDeploymentInfo] = field(default_factory=dict)
    machine_sets: dict[tuple[str, str], MachineSetInfo] = field(default_factory=dict)
    control_planes: dict[tuple[str, str], ControlPlaneInfo] = field(default_factory=dict)
    machines: dict[tuple[str, str], MachineInfo] = field(default_factory=dict)
    nodeplans: dict[tuple[str, str], NodePlanInfo] = field(default_factory=dict)
    nodes: dict[ClusterKey, dict[str, NodeInfo] | None] = field(default_factory=dict)
    log: list[Action] = field(default_factory=list)
    created: list[CreateNodePlan] = field(default_factory=list)
    # FleetUpgrades; MD/KCP ``version`` here is what the object itself says
    upgrades: dict[tuple[str, str], FleetUpgradeInfo] = field(default_factory=dict)
    autopilot_plans: dict[ClusterKey, str] = field(default_factory=dict)
    catalog: ReleaseCatalog = EMPTY_CATALOG  # the releases a ladder may climb by

    def snapshot(self) -> Snapshot:
        snap = Snapshot(
            now=self.now, clusters=dict(self.clusters), deployments=dict(self.deployments),
            machine_sets=dict(self.machine_sets), control_planes=dict(self.control_planes),
            machines=dict(self.machines), nodeplans=dict(self.nodeplans),
            nodes={k: (None if v is None else dict(v)) for k, v in self.nodes.items()},
            autopilot_plans=dict(self.autopilot_plans),
        )
        return apply_intents(snap, self.upgrades.values(), self.catalog)

    # -- controller side ---------------------------------------------------------------
    def apply_all(self, actions: Iterable[Action]) -> None:
        for a in actions:
            self.apply(a)

    def apply(self, a: Action) -> None:
        self.log.append(a)
        if isinstance(a, CreateNodePlan):
            key = (a.machine.namespace, nodeplan_name(a.machine.name, a.version))
            if key in self.nodeplans:
                return
            self.created.append(a)
            self.nodeplans[key] = NodePlanInfo(
                ref=ObjectRef(KIND_NODEPLAN, key[0], key[1], uid=f"uid-{key[1]}"),
                cluster=a.cluster[1], machine=a.machine.name, node=a.node, role=a.role,
                owner_kind=a.owner.kind, owner_name=a.owner.name, version=a.version,
                url=f"https://example.invalid/k0s-{a.version}", sha256="0" * 64,
                executor=a.executor, created=self.now, finalizers=(NODEPLAN_FINALIZER,))
        elif isinstance(a, StartNodePlan | RetryNodePlan):
            self._plan(a.plan, started_at=a.started_at, phase_since=a.started_at,
                       attempts=a.attempts, phase=NodePlanPhase.PENDING, node_state="",
                       message="", reason="", node_state_at=None)
        elif isinstance(a, SignalNode):
            nodes = self.nodes.get(a.cluster)
            if nodes is None or a.node not in nodes:
                return
            node = nodes[a.node]
            if a.executor == EXECUTOR_AUTOPILOT:
                raise NotImplementedError("the simulator plays the agent protocol only")
            # Written as the dispatcher writes it, read as the snapshot reads it.
            ex = executor(a.executor)
            data = parse_signal({ex.data_key: ex.encode(a.request),
                                 ex.version_key: SIGNAL_VERSION})
            nodes[a.node] = dataclasses.replace(node, signal=data)
        elif isinstance(a, UpdateNodePlanStatus):
            self._plan(a.plan, phase=a.phase, node_state=a.node_state, message=a.message,
                       phase_since=a.phase_since, completed_at=a.completed_at,
                       conditions=a.conditions, node_state_at=a.node_state_at)
        elif isinstance(a, MarkNodePlanFailed):
            self._plan(a.plan, phase=NodePlanPhase.FAILED, node_state=a.node_state,
                       message=a.message, reason=a.reason, phase_since=self.now,
                       conditions=(Condition(NP_FAILED, "True", a.reason, a.message),))
        elif isinstance(a, RemoveAnnotation):
            self._remove_annotation(a)
        elif isinstance(a, ClearSignal):
            nodes = self.nodes.get(a.cluster)
            if nodes and a.node in nodes and nodes[a.node].signal is not None \
                    and nodes[a.node].signal.planId == a.plan_id:  # type: ignore[union-attr]
                nodes[a.node] = dataclasses.replace(nodes[a.node], signal=None)
        elif isinstance(a, UncordonNode):
            nodes = self.nodes.get(a.cluster)
            if nodes and a.node in nodes:
                nodes[a.node] = dataclasses.replace(nodes[a.node], unschedulable=False,
                                                    cordoned_by=None)
        elif isinstance(a, ReleaseNodePlan):
            key = (a.plan.namespace, a.plan.name)
            if key in self.nodeplans and self.nodeplans[key].deleting:
                del self.nodeplans[key]
        elif isinstance(a, PatchMachineVersion):
            m = self.machines[(a.machine.namespace, a.machine.name)]
            self.machines[(a.machine.namespace, a.machine.name)] = dataclasses.replace(
                m, version=a.version, annotations={
                    **m.annotations,
                    **({ANN_MACHINE_RUNNING_VERSION: a.version} if a.record_running else {})})
        elif isinstance(a, PauseObject | ReleasePause) and a.owner.kind == "MachineSet":
            key = (a.owner.namespace, a.owner.name)
            ms = self.machine_sets[key]
            anns = dict(ms.annotations)
            if isinstance(a, PauseObject) and ANN_CAPI_PAUSED not in anns:
                anns |= {ANN_CAPI_PAUSED: "", ANN_PAUSED_FOR: a.version}
                if a.template_version:
                    ms = dataclasses.replace(ms, version=a.version)
            elif isinstance(a, ReleasePause) and ANN_PAUSED_FOR in anns:
                anns.pop(ANN_PAUSED_FOR)
                anns.pop(ANN_CAPI_PAUSED, None)
            # Cluster API's next reconcile reports the pause (its Paused condition), as
            # soon as the simulated world moves: in the same step.
            self.machine_sets[key] = dataclasses.replace(
                ms, annotations=anns, paused_reported=(
                    ANN_CAPI_PAUSED in anns if ms.paused_reported is not None else None))
        elif isinstance(a, RecordWrittenVersion | WriteVersion | ReleasePause):
            self._write_version(a)
        elif isinstance(a, PatchMachineSetVersion):
            key = (a.machine_set.namespace, a.machine_set.name)
            self.machine_sets[key] = dataclasses.replace(self.machine_sets[key],
                                                         version=a.version)
        elif isinstance(a, AnnotateWorkerVersion):
            m = self.machines[(a.machine.namespace, a.machine.name)]
            self.machines[(a.machine.namespace, a.machine.name)] = dataclasses.replace(
                m, annotations={**m.annotations, ANN_MACHINE_RUNNING_VERSION: a.version})
        elif isinstance(a, SetRolloutStatus):
            key = (a.owner.namespace, a.owner.name)
            status = RolloutStatus(conditions=a.conditions, counts=a.counts.as_status())
            if a.owner.kind == KIND_MD and key in self.deployments:
                self.deployments[key] = dataclasses.replace(self.deployments[key], status=status)
            elif a.owner.kind == KIND_KCP and key in self.control_planes:
                self.control_planes[key] = dataclasses.replace(self.control_planes[key],
                                                               status=status)
        # HaltObject, ReportNotInPlace, RecordEvent: events only.

    def _write_version(self, a: RecordWrittenVersion | WriteVersion | ReleasePause) -> None:
        """As the dispatcher does it (one patch each; refused when no longer wanted)."""
        key = (a.owner.namespace, a.owner.name)
        if a.owner.kind == KIND_WORKER_TEMPLATE:
            self._write_template(a)
            return
        obj: MachineDeploymentInfo | ControlPlaneInfo | None = (
            self.deployments.get(key) if a.owner.kind == KIND_MD else
            self.control_planes.get(key))
        if obj is None:
            return
        anns = dict(obj.annotations)
        version = obj.version
        if isinstance(a, RecordWrittenVersion):
            if obj.version != a.version:
                return
            anns[ANN_WRITTEN_VERSION] = a.version
        elif isinstance(a, WriteVersion):
            if obj.version != a.expected or anns.get(ANN_WRITTEN_VERSION) != a.expected:
                return
            version = a.version
            anns[ANN_WRITTEN_VERSION] = a.version
            if a.pause:
                anns |= {ANN_CAPI_PAUSED: "", ANN_PAUSED_FOR: a.version}
        else:
            if ANN_PAUSED_FOR not in anns:
                return
            anns.pop(ANN_PAUSED_FOR)
            anns.pop(ANN_CAPI_PAUSED, None)
        new = dataclasses.replace(obj, version=version, annotations=anns)
        if isinstance(new, MachineDeploymentInfo):
            self.deployments[key] = new
        else:
            self.control_planes[key] = new

    def _write_template(self, a: RecordWrittenVersion | WriteVersion | ReleasePause) -> None:
        for key, md in list(self.deployments.items()):
            tpl = md.worker_template
            if tpl is None or tpl.ref != a.owner:
                continue
            anns = dict(tpl.annotations)
            version = tpl.version
            if isinstance(a, RecordWrittenVersion) and tpl.version == a.version:
                anns[ANN_WRITTEN_VERSION] = a.version
            elif isinstance(a, WriteVersion) and tpl.version == a.expected \
                    and anns.get(ANN_WRITTEN_VERSION) == a.expected:
                version = a.version
                anns[ANN_WRITTEN_VERSION] = a.version
            else:
                continue
            self.deployments[key] = dataclasses.replace(md, worker_template=dataclasses.replace(
                tpl, version=version, annotations=anns))

    def _plan(self, ref: ObjectRef, **changes: object) -> None:
        key = (ref.namespace, ref.name)
        if key in self.nodeplans:
            self.nodeplans[key] = dataclasses.replace(self.nodeplans[key], **changes)  # type: ignore[arg-type]

    def _remove_annotation(self, a: RemoveAnnotation) -> None:
        key = (a.obj.namespace, a.obj.name)
        table: dict[tuple[str, str], object] | None = {
            KIND_NODEPLAN: self.nodeplans, KIND_MD: self.deployments,
            KIND_KCP: self.control_planes}.get(a.obj.kind)  # type: ignore[assignment]
        if table is None or key not in table:
            return
        obj = table[key]
        anns = dict(obj.annotations)  # type: ignore[attr-defined]
        if anns.get(a.key) == a.value:
            anns.pop(a.key)
            table[key] = dataclasses.replace(obj, annotations=anns)  # type: ignore[type-var]

    # -- operator side -----------------------------------------------------------------
    def delete_plan(self, key: tuple[str, str]) -> None:
        p = self.nodeplans[key]
        if p.finalizers:
            self.nodeplans[key] = dataclasses.replace(p, deleting=True)
        else:
            del self.nodeplans[key]

    def annotate(self, kind: str, key: tuple[str, str], name: str, value: str) -> None:
        table: dict[tuple[str, str], object] = {
            KIND_NODEPLAN: self.nodeplans, KIND_MD: self.deployments,
            KIND_KCP: self.control_planes}[kind]  # type: ignore[assignment]
        obj = table[key]
        table[key] = dataclasses.replace(  # type: ignore[type-var]
            obj, annotations={**obj.annotations, name: value})  # type: ignore[attr-defined]

    # -- node side (a model of the agent) ----------------------------------------------
    def active_requests(self) -> list[tuple[ClusterKey, str]]:
        out = []
        for ckey, nodes in sorted(self.nodes.items()):
            for name, n in sorted((nodes or {}).items()):
                if n.signal is not None and (n.signal.status is None
                                             or not n.signal.status.status.terminal):
                    out.append((ckey, name))
        return out

    def step_node(self, ckey: ClusterKey, name: str, *, fail: SignalState | None = None) -> None:
        """Advance one node's request by one state (or fail it)."""
        nodes = self.nodes[ckey]
        assert nodes is not None
        n = nodes[name]
        sig = n.signal
        if sig is None or (sig.status is not None and sig.status.status.terminal):
            return
        if fail is not None:
            nodes[name] = dataclasses.replace(
                n, signal=sig.with_status(SignalStatus(status=fail, timestamp=self.now,
                                                       reason="simulated failure")),
                unschedulable=False if n.cordoned_by else n.unschedulable, cordoned_by=None,
                ready=True)
            return
        cur = sig.status.status if sig.status else None
        nxt = HAPPY_PATH[0] if cur is None else HAPPY_PATH[HAPPY_PATH.index(cur) + 1]
        if cur is None and n.running_version == sig.command.k0supdate.version:
            nxt = SignalState.COMPLETED
        changes: dict[str, object] = {
            "signal": sig.with_status(SignalStatus(status=nxt, timestamp=self.now))}
        if nxt == SignalState.CORDONING and not n.unschedulable:
            changes.update(unschedulable=True, cordoned_by=AGENT)
        elif nxt == SignalState.RESTARTING:
            changes.update(ready=False)
        elif nxt == SignalState.VERIFYING:
            changes.update(ready=True, running_version=sig.command.k0supdate.version)
        elif nxt == SignalState.UNCORDONING and n.cordoned_by:
            changes.update(unschedulable=False, cordoned_by=None)
        nodes[name] = dataclasses.replace(n, **changes)  # type: ignore[arg-type]

    def finish_node(self, ckey: ClusterKey, name: str) -> None:
        for _ in range(len(HAPPY_PATH) + 1):
            self.step_node(ckey, name)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def deadline_failed(p: NodePlanInfo) -> bool:
    return p.phase == NodePlanPhase.FAILED and p.reason == R_DEADLINE


def add_cluster(
    sim: SimFleet,
    name: str,
    *,
    namespace: str = "default",
    control_planes: int = 3,
    workers: int = 6,
    max_unavailable: int | str | None = 2,
    version: str = "v1.31.2+k0s.0",
    executor: str = "agent",
) -> ClusterKey:
    """A CAPI cluster as k0smotron builds it: KCP + MD + MS + Machines + Nodes, all on
    ``version`` and Ready."""
    ckey = (namespace, name)
    sim.clusters[ckey] = ClusterInfo(namespace, name, executor=executor)
    # Nodes as a real cluster publishes them: the kubelet's version, no k0s-fleet record.
    kubelet = kubelet_version(version)
    nodes: dict[str, NodeInfo] = {}
    infra_cp = TemplateRef("infrastructure.cluster.x-k8s.io", "SimMachineTemplate", f"{name}-cp")
    if control_planes:
        kcp = ControlPlaneInfo(
            ref=ObjectRef(KIND_KCP, namespace, f"{name}-cp"), cluster=name,
            replicas=control_planes, version=version, infrastructure=infra_cp,
            k0s_config={"args": ["--debug"]})
        sim.control_planes[(namespace, kcp.ref.name)] = kcp
        for i in range(control_planes):
            mname = f"{name}-cp-{i}"
            sim.machines[(namespace, mname)] = MachineInfo(
                ref=ObjectRef("Machine", namespace, mname), cluster=name, version=version,
                role=ROLE_CONTROLLER, created=sim.now + timedelta(seconds=i), owner=kcp.ref,
                node_name=mname, annotations={ANN_K0S_CONFIG: '{"args": ["--debug"]}'},
                infra=InfraMachineInfo(infra_cp.name, infra_cp.group_kind))
            nodes[mname] = NodeInfo(mname, kubelet_version=kubelet)
    if workers:
        boot = TemplateRef("bootstrap.cluster.x-k8s.io", "K0sWorkerConfigTemplate", f"{name}-w")
        infra = TemplateRef("infrastructure.cluster.x-k8s.io", "SimMachineTemplate", f"{name}-w")
        md = MachineDeploymentInfo(
            ref=ObjectRef(KIND_MD, namespace, f"{name}-md"), cluster=name, replicas=workers,
            version=version, max_unavailable=max_unavailable, bootstrap=boot,
            infrastructure=infra)
        sim.deployments[(namespace, md.ref.name)] = md
        ms = MachineSetInfo(ref=ObjectRef("MachineSet", namespace, f"{name}-md-ms"),
                            cluster=name, deployment=md.ref.name, bootstrap=boot,
                            infrastructure=infra, replicas=workers, version=version,
                            paused_reported=False)  # as Cluster API reports it
        sim.machine_sets[(namespace, ms.ref.name)] = ms
        for i in range(workers):
            mname = f"{name}-md-{i}"
            sim.machines[(namespace, mname)] = MachineInfo(
                ref=ObjectRef("Machine", namespace, mname), cluster=name, version=version,
                role=ROLE_WORKER, created=sim.now + timedelta(seconds=100 + i), owner=md.ref,
                machine_set=ms.ref.name, node_name=mname)
            nodes[mname] = NodeInfo(mname, kubelet_version=kubelet)
    sim.nodes[ckey] = nodes
    return ckey


def bump(sim: SimFleet, cluster: ClusterKey, version: str, *, control_plane: bool = True,
         workers: bool = True) -> None:
    """Move a cluster's KCP and/or MD to ``version`` as k0s-fleet's version writer does
    once a FleetUpgrade asks for it and the policy admits the cluster: the version, the
    writer's record and its pause in one write (fleet/planner/writer.py). An object not
    yet adopted is adopted first (a hand edit is never a target)."""
    for key, kcp in list(sim.control_planes.items()):
        if control_plane and (kcp.ref.namespace, kcp.cluster) == cluster:
            sim.control_planes[key] = _written(kcp, version)
    for key, md in list(sim.deployments.items()):
        if workers and (md.ref.namespace, md.cluster) == cluster:
            sim.deployments[key] = _written(md, version)


def _written(obj: _O, version: str) -> _O:
    anns = dict(obj.annotations)
    anns[ANN_WRITTEN_VERSION] = version
    if ANN_CAPI_PAUSED not in anns or ANN_PAUSED_FOR in anns:
        anns |= {ANN_CAPI_PAUSED: "", ANN_PAUSED_FOR: version}
    return dataclasses.replace(obj, version=version, annotations=anns)


