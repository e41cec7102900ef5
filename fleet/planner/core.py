"""The planner: a pure function from a Snapshot to the actions that move the fleet on.

Rules (docs/controller.md has the long form):

* Control planes of a cluster: one node at a time, only while every control-plane node is
  Ready and none is in flight or failed-not-cleared, oldest Machine first.
* Workers of a cluster wait until every control-plane Machine runs its KCP's target and
  none is in flight, and never go to a version newer than the oldest control plane.
* Workers of a MachineDeployment: at most ``maxUnavailable`` unavailable, where
  unavailable = Machines with an in-flight NodePlan + nodes NotReady / unschedulable /
  missing + Failed NodePlans for the target not yet cleared + missing replicas.
* A per-object failure budget halts new dispatches; the retry annotation resets failures.
* Per-phase progress deadlines turn a silent node into a Failed NodePlan.

Everything is recomputed from the snapshot on every pass: there is no memory here.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache

from fleet.budget import InvalidMaxUnavailableError, UnavailabilityBudget
from fleet.eligibility import (
    Eligibility,
    control_plane_eligibility,
    machine_deployment_eligibility,
    same_version,
)
from fleet.executors import EXECUTORS, executor, request_for
from fleet.model import (
    ANN_RETRY,
    KIND_KCP,
    KIND_MD,
    NODEPLAN_FINALIZER,
    ROLE_CONTROLLER,
    ClusterInfo,
    ClusterKey,
    Condition,
    ControlPlaneInfo,
    MachineDeploymentInfo,
    MachineInfo,
    MachineSetInfo,
    NodeInfo,
    NodePlanInfo,
    ObjectRef,
    RolloutStatus,
    Snapshot,
)
from fleet.nodeplan import NodePlanPhase
from fleet.nodeplan import nodeplan_name as _nodeplan_name
from fleet.planner import conditions as C
from fleet.planner.actions import (
    Action,
    AnnotateWorkerVersion,
    ClearSignal,
    CreateNodePlan,
    Decision,
    HaltObject,
    MarkNodePlanFailed,
    PatchMachineSetVersion,
    PatchMachineVersion,
    PauseObject,
    PlanResult,
    ReleaseNodePlan,
    ReleasePause,
    RemoveAnnotation,
    ReportNotInPlace,
    ReportOtherDriver,
    ReportVersionConflict,
    RetryNodePlan,
    RolloutCounts,
    SetRolloutStatus,
    SignalNode,
    StartNodePlan,
    UncordonNode,
    UpdateNodePlanStatus,
)
from fleet.planner.policy import Hold
from fleet.planner.settings import COMPLETING, PENDING, PlannerSettings
from fleet.planner.writer import (
    ExtensionDrives,
    OtherDriver,
    VersionStep,
    enrolled,
    other_driver,
    release_pause,
    version_step,
)
from fleet.signal import SignalState
from fleet.versions import InvalidVersionError, K0sVersion, normalize

_MAX_MESSAGE = 900
nodeplan_name = lru_cache(maxsize=65536)(_nodeplan_name)


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """The state of a NodePlan's request as the node reports it right now."""

    state: SignalState | None
    reason: str


PHASE_DELETING = "Deleting"


@dataclass(slots=True)
class PlanView:
    """A NodePlan's effective state after this pass' upkeep actions."""

    plan: NodePlanInfo
    phase: str
    in_flight: bool
    failed: bool
    completed: bool


def plan(snapshot: Snapshot, settings: PlannerSettings, *, hold: Hold | None = None
         ) -> PlanResult:
    """Compute the actions for one pass. Pure: same snapshot, same answer.

    ``hold(cluster, owner)`` may name a reason to start no new node upgrade for that
    object now (the fleet rollout's waves, windows and pauses); nodes already in flight
    are looked after regardless.
    """
    return _Pass(snapshot, settings, hold).run()


def _truncate(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


@lru_cache(maxsize=4096)
def _valid_version(v: str | None) -> str | None:
    if not v or not isinstance(v, str):
        return None
    try:
        return normalize(v)
    except InvalidVersionError:
        return None


class _Pass:
    def __init__(self, snapshot: Snapshot, settings: PlannerSettings,
                 hold: Hold | None = None) -> None:
        self.hold = hold or (lambda _cluster, _owner: None)
        self.s = snapshot
        self.settings = settings
        self.now = snapshot.now
        self.actions: list[Action] = []
        self.decisions: list[Decision] = []
        self.wake_at: datetime | None = None
        self.views: dict[tuple[str, str], PlanView] = {}
        self.completed: dict[tuple[str, str], NodePlanInfo] = {}
        # (namespace, machine) -> views of all its NodePlans
        self.by_machine: dict[tuple[str, str], list[PlanView]] = defaultdict(list)
        self.machines_by_owner: dict[ObjectRef, list[MachineInfo]] = defaultdict(list)
        for m in snapshot.machines.values():
            if m.owner is not None:
                self.machines_by_owner[m.owner].append(m)
        # Indexes, so that a pass stays linear in the size of the fleet.
        self.plans_by_cluster: dict[ClusterKey, list[NodePlanInfo]] = defaultdict(list)
        for p in snapshot.nodeplans.values():
            self.plans_by_cluster[(p.ref.namespace, p.cluster)].append(p)
        self.kcps_by_cluster: dict[ClusterKey, list[ControlPlaneInfo]] = defaultdict(list)
        for k in snapshot.control_planes.values():
            self.kcps_by_cluster[(k.ref.namespace, k.cluster)].append(k)
        self.views_by_owner: dict[tuple[str, str, str], list[PlanView]] = defaultdict(list)
        self.sets_by_deployment: dict[tuple[str, str], list[MachineSetInfo]] = defaultdict(list)
        for mset in snapshot.machine_sets.values():
            if mset.deployment:
                self.sets_by_deployment[(mset.ref.namespace, mset.deployment)].append(mset)
        for ms in self.machines_by_owner.values():
            ms.sort(key=MachineInfo.sort_key)

    # -- helpers -----------------------------------------------------------------------
    def emit(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def wake(self, at: datetime) -> None:
        if self.wake_at is None or at < self.wake_at:
            self.wake_at = at

    def cluster(self, namespace: str, name: str) -> ClusterInfo | None:
        return self.s.clusters.get((namespace, name))

    def nodes(self, key: ClusterKey) -> dict[str, NodeInfo] | None:
        nodes = self.s.nodes.get(key)
        return None if nodes is None else dict(nodes)

    def node(self, key: ClusterKey, name: str) -> NodeInfo | None:
        nodes = self.s.nodes.get(key)
        return None if nodes is None else nodes.get(name)

    def owner_target(self, p: NodePlanInfo) -> str | None:
        key = (p.ref.namespace, p.owner_name)
        if p.owner_kind == KIND_MD and key in self.s.deployments:
            return _valid_version(self.s.deployments[key].version)
        if p.owner_kind == KIND_KCP and key in self.s.control_planes:
            return _valid_version(self.s.control_planes[key].version)
        return None

    # -- the pass ----------------------------------------------------------------------
    def run(self) -> PlanResult:
        for key in sorted(self.s.nodeplans):
            self._upkeep(self.s.nodeplans[key])
        self._record_completions()
        self._owner_retries()
        self._orphan_signals()
        for key in sorted(self.s.control_planes):
            self._control_plane(self.s.control_planes[key])
        for key in sorted(self.s.deployments):
            self._deployment(self.s.deployments[key])
        return PlanResult(actions=self.actions, wake_at=self.wake_at, decisions=self.decisions)

    # -- NodePlan upkeep ---------------------------------------------------------------
    def _request_state(self, p: NodePlanInfo, node: NodeInfo | None) -> NodeRequest | None:
        """The node's answer to exactly this request (plan id + created), or None."""
        if node is None or p.started_at is None:
            return None
        carried = executor(p.executor).carried(node)
        if carried is None or not carried.is_request(p.plan_id, p.started_at,
                                                     max(1, p.attempts)):
            return None
        return NodeRequest(carried.state, carried.reason)

    def _node_busy_with_other(self, p: NodePlanInfo, node: NodeInfo) -> str | None:
        """Another live NodePlan's request occupies the node: do not overwrite it."""
        carried = executor(p.executor).carried(node)
        if carried is None or carried.plan_id == p.plan_id or carried.terminal:
            return None
        other_id = carried.plan_id
        ns, _, name = other_id.partition("/")
        other = self.s.nodeplans.get((ns, name))
        if other is None or other.terminal:
            return None
        return other_id

    def _add_view(self, p: NodePlanInfo, phase: str) -> PlanView:
        view = PlanView(
            plan=p, phase=phase,
            in_flight=phase in (NodePlanPhase.PENDING, NodePlanPhase.IN_PROGRESS),
            failed=phase == NodePlanPhase.FAILED,
            completed=phase == NodePlanPhase.COMPLETED,
        )
        self.views[(p.ref.namespace, p.ref.name)] = view
        self.by_machine[(p.ref.namespace, p.machine)].append(view)
        self.views_by_owner[(p.ref.namespace, p.owner_kind, p.owner_name)].append(view)
        return view

    def _upkeep(self, p: NodePlanInfo) -> None:
        ckey: ClusterKey = (p.ref.namespace, p.cluster)
        node = self.node(ckey, p.node)
        if p.deleting:
            self._deleting(p, ckey, node)
            # Until its request is off the node it still occupies that node; either way
            # it keeps its name taken, so the Machine is not dispatched again meanwhile.
            view = self._add_view(p, PHASE_DELETING)
            view.in_flight = node is not None and self._live_on_node(p, node)
            return

        retry = p.annotations.get(ANN_RETRY)
        if retry is not None and self._retry_plan(p, node, retry):
            return

        if not p.started and self.s.nodes.get(ckey) is None:
            # Its node unseen (cluster not listed yet): it may carry a request of this plan
            # already, which must be adopted, not replaced. Wait until it is seen.
            self._add_view(p, NodePlanPhase.PENDING)
            return
        if not p.started:
            attempts = max(1, p.attempts + (1 if p.phase == NodePlanPhase.FAILED else 0))
            # The node may carry this plan's request already (signalled, then the status
            # write was lost to a crash): adopt it rather than replace it.
            started = self.now
            for ex in EXECUTORS.values():
                carried = ex.carried(node) if node is not None else None
                if carried is not None and carried.plan_id == p.plan_id \
                        and carried.command_id == attempts:
                    started = carried.created or self.now
                    break
            self.emit(StartNodePlan(p.ref, attempts=attempts, started_at=started,
                                    previous_phase=p.phase))
            self._add_view(p, NodePlanPhase.PENDING)
            return

        if p.phase == NodePlanPhase.COMPLETED:
            self._add_view(p, NodePlanPhase.COMPLETED)
            self._complete_machine(p)
            return

        req = self._request_state(p, node)
        version_ok = node is not None and executor(p.executor).runs(node, p.version)

        if p.phase == NodePlanPhase.FAILED:
            # A node that missed a deadline but then finished is done after all.
            late = (p.reason == C.R_DEADLINE and req is not None
                    and req.state == SignalState.COMPLETED and node is not None
                    and node.available and version_ok)
            if late and node is not None:
                self._mark_completed(p, node)
                return
            self._add_view(p, NodePlanPhase.FAILED)
            return

        # Pending or InProgress.
        if req is None:
            self._ensure_signalled(p, ckey, node)
            state_key = PENDING
            phase = NodePlanPhase.PENDING if p.phase == NodePlanPhase.PENDING else p.phase
            node_state = ""
            message = self._pending_message(p, ckey, node)
        elif req.state is None:
            state_key, phase, node_state, message = PENDING, NodePlanPhase.PENDING, "", \
                "signalled; waiting for the node to answer"
        elif req.state.failed:
            self.emit(MarkNodePlanFailed(
                p.ref, reason=C.R_NODE_FAILED, node_state=req.state.value,
                message=_truncate(f"node {p.node}: {req.state.value}"
                                  + (f": {req.reason}" if req.reason else ""))))
            self._add_view(p, NodePlanPhase.FAILED)
            return
        elif req.state == SignalState.COMPLETED:
            if node is not None and node.available and version_ok:
                self._mark_completed(p, node)
                return
            state_key, phase, node_state = COMPLETING, NodePlanPhase.IN_PROGRESS, \
                SignalState.COMPLETED.value
            waiting = []
            if node is not None and not node.ready:
                waiting.append("Ready")
            if node is not None and node.unschedulable:
                waiting.append("schedulable")
            if not version_ok:
                waiting.append(f"reporting {p.version} (reports "
                               f"{node.running_version if node else None})")
            message = f"node says Completed; waiting for it to be {', '.join(waiting)}"
        else:
            state_key, phase, node_state = req.state.value, NodePlanPhase.IN_PROGRESS, \
                req.state.value
            message = req.reason or f"node {p.node}: {req.state.value}"

        changed_state = node_state != p.node_state
        since = self.now if changed_state else (p.phase_since or p.started_at or self.now)
        if (phase, node_state, message) != (p.phase, p.node_state, p.message):
            self.emit(UpdateNodePlanStatus(
                p.ref, phase=phase, node_state=node_state, message=_truncate(message),
                phase_since=since, completed_at=None, running_version=None,
                conditions=self._plan_conditions(p, phase, message, dispatched=req is not None)))
        view = self._add_view(p, phase)
        if not changed_state:
            limit = self.settings.deadline(state_key)
            expires = since + limit
            if self.now >= expires:
                self.emit(MarkNodePlanFailed(
                    p.ref, reason=C.R_DEADLINE, node_state=node_state, deadline=True,
                    message=_truncate(
                        f"no progress in {state_key} for {int(limit.total_seconds())}s "
                        f"(deadline): {message}")))
                view.phase, view.in_flight, view.failed = NodePlanPhase.FAILED, False, True
            else:
                self.wake(expires)
        else:
            self.wake(self.now + self.settings.deadline(state_key))

    def _pending_message(self, p: NodePlanInfo, ckey: ClusterKey,
                         node: NodeInfo | None) -> str:
        if self.s.nodes.get(ckey) is None:
            return f"workload cluster {p.cluster} unreachable"
        if node is None:
            return f"node {p.node} not found in cluster {p.cluster}"
        busy = self._node_busy_with_other(p, node)
        if busy:
            return f"node {p.node} is busy with {busy}"
        return "signalling the node"

    def _ensure_signalled(self, p: NodePlanInfo, ckey: ClusterKey,
                          node: NodeInfo | None) -> None:
        if node is None or p.started_at is None or self._node_busy_with_other(p, node):
            return
        self.emit(SignalNode(
            plan=p.ref, cluster=ckey, node=node.name, node_kind=node.kind, executor=p.executor,
            request=request_for(p, created=p.started_at, attempt=max(1, p.attempts),
                                traceparent=p.traceparent or p.annotations.get(
                                    "tracing.k8s.io/traceparent", ""))))

    def _plan_conditions(self, p: NodePlanInfo, phase: str, message: str, *,
                         dispatched: bool) -> tuple[Condition, ...]:
        return (
            Condition(C.NP_DISPATCHED, "True" if dispatched else "False",
                      C.R_SIGNALLED if dispatched else C.R_NOT_SIGNALLED,
                      "" if dispatched else _truncate(message)),
            Condition(C.NP_COMPLETED, "True" if phase == NodePlanPhase.COMPLETED else "False",
                      C.R_COMPLETED if phase == NodePlanPhase.COMPLETED else C.R_IN_PROGRESS,
                      ""),
            Condition(C.NP_FAILED, "False", C.R_IN_PROGRESS, ""),
        )

    def _mark_completed(self, p: NodePlanInfo, node: NodeInfo) -> None:
        message = f"node {p.node} runs {p.version} and is Ready"
        self.emit(UpdateNodePlanStatus(
            p.ref, phase=NodePlanPhase.COMPLETED, node_state=SignalState.COMPLETED.value,
            message=message, phase_since=self.now, completed_at=self.now,
            running_version=node.running_version or p.version,
            conditions=self._plan_conditions(p, NodePlanPhase.COMPLETED, message,
                                             dispatched=True)))
        self._add_view(p, NodePlanPhase.COMPLETED)
        self._complete_machine(dataclasses.replace(p, completed_at=self.now))

    def _complete_machine(self, p: NodePlanInfo) -> None:
        """Remember a completed plan; the latest one per Machine is recorded on it."""
        key = (p.ref.namespace, p.machine)
        best = self.completed.get(key)
        order = (p.completed_at or p.started_at or self.now, p.started_at or self.now,
                 p.ref.name)
        if best is None or order > (best.completed_at or best.started_at or self.now,
                                    best.started_at or self.now, best.ref.name):
            self.completed[key] = p

    def _record_completions(self) -> None:
        for key in sorted(self.completed):
            self._record_completion(self.completed[key])

    def _record_completion(self, p: NodePlanInfo) -> None:
        if p.source != "controller":
            return  # Cluster API's in-place flow records the version itself.
        m = self.s.machines.get((p.ref.namespace, p.machine))
        if m is None or m.deleting:
            return
        if p.role == ROLE_CONTROLLER:
            if not same_version(m.version, p.version):
                self.emit(PatchMachineVersion(m.ref, p.version))
        elif not same_version(m.running_version_annotation, p.version) and not same_version(
                m.version, p.version):
            self.emit(AnnotateWorkerVersion(m.ref, p.version))

    def _deleting(self, p: NodePlanInfo, ckey: ClusterKey, node: NodeInfo | None) -> None:
        """A NodePlan being deleted: take its request off the node, uncordon, release."""
        if NODEPLAN_FINALIZER not in p.finalizers:
            return
        cluster_known = self.s.nodes.get(ckey) is not None
        cluster_gone = self.cluster(ckey[0], ckey[1]) is None
        if node is not None and self._carries_request_of(node, p):
            self.emit(ClearSignal(ckey, node.name, node.kind, p.executor, p.plan_id))
            return
        if node is not None and node.cordoned_by is not None and not self._node_has_live_request(
                node, exclude=p.plan_id):
            self.emit(UncordonNode(ckey, node.name))
            return
        if cluster_known or cluster_gone:
            self.emit(ReleaseNodePlan(p.ref))

    def _carries_request_of(self, node: NodeInfo, p: NodePlanInfo) -> bool:
        carried = executor(p.executor).carried(node)
        return carried is not None and carried.plan_id == p.plan_id

    def _live_on_node(self, p: NodePlanInfo, node: NodeInfo) -> bool:
        """The node carries this plan's request and has not finished it."""
        carried = executor(p.executor).carried(node)
        return carried is not None and carried.plan_id == p.plan_id and not carried.terminal

    @staticmethod
    def _carries_live_request(node: NodeInfo) -> bool:
        return any(c is not None and not c.terminal
                   for c in (ex.carried(node) for ex in EXECUTORS.values()))

    def _node_has_live_request(self, node: NodeInfo, *, exclude: str = "") -> bool:
        sig = node.signal
        if sig is None or sig.planId == exclude:
            return False
        if sig.status is not None and sig.status.status.terminal:
            return False
        ns, _, name = sig.planId.partition("/")
        other = self.s.nodeplans.get((ns, name))
        return other is not None and not other.terminal

    def _retry_plan(self, p: NodePlanInfo, node: NodeInfo | None, token: str) -> bool:
        """Handle the retry annotation on a NodePlan. True when the plan was reset."""
        if p.phase != NodePlanPhase.FAILED:
            self.emit(RemoveAnnotation(p.ref, ANN_RETRY, token))
            return False
        target = self.owner_target(p)
        if target is not None and not same_version(target, p.version):
            self.emit(RemoveAnnotation(p.ref, ANN_RETRY, token))
            return False  # superseded by a newer target: nothing to retry
        if p.role == ROLE_CONTROLLER and self._control_plane_busy(p.ref.namespace, p.cluster,
                                                                   exclude=p):
            return False  # keep the annotation: retried once no other control plane moves
        self._reset(p)
        self.emit(RemoveAnnotation(p.ref, ANN_RETRY, token))
        return True

    def _reset(self, p: NodePlanInfo) -> None:
        # A new request must differ from the last one even when clocks are coarse.
        started = self.now if p.started_at is None or self.now > p.started_at \
            else p.started_at + timedelta(microseconds=1)
        self.emit(RetryNodePlan(p.ref, attempts=max(1, p.attempts) + 1, started_at=started))
        view = self._add_view(p, NodePlanPhase.PENDING)
        view.in_flight = True
        self.wake(self.now)

    def _control_plane_busy(self, namespace: str, cluster: str, *,
                            exclude: NodePlanInfo | None = None) -> bool:
        for p in self.plans_by_cluster.get((namespace, cluster), ()):
            if p is exclude:
                continue
            if p.role != ROLE_CONTROLLER:
                continue
            view = self.views.get((p.ref.namespace, p.ref.name))
            if view is not None and view.in_flight:
                return True
            if view is None and not p.terminal and not p.deleting:
                return True
        return False

    def _owner_retries(self) -> None:
        """The retry annotation on an MD/KCP retries its Failed NodePlans for the target."""
        owners: list[tuple[ObjectRef, str | None, dict[str, str]]] = [
            (md.ref, md.version, dict(md.annotations)) for md in self.s.deployments.values()
        ] + [(k.ref, k.version, dict(k.annotations)) for k in self.s.control_planes.values()]
        for ref, version, anns in sorted(owners, key=lambda o: o[0]):
            token = anns.get(ANN_RETRY)
            if token is None:
                continue
            target = _valid_version(version)
            for view in sorted(self.views.values(), key=lambda v: v.plan.ref):
                p = view.plan
                if (not view.failed or p.deleting or p.ref.namespace != ref.namespace
                        or p.owner_kind != ref.kind or p.owner_name != ref.name
                        or not same_version(p.version, target)):
                    continue
                if p.role == ROLE_CONTROLLER and self._control_plane_busy(
                        p.ref.namespace, p.cluster, exclude=p):
                    continue
                self._reset(p)
                view.phase, view.failed = NodePlanPhase.PENDING, False
            self.emit(RemoveAnnotation(ref, ANN_RETRY, token))

    def _orphan_signals(self) -> None:
        """Requests on nodes whose NodePlan no longer exists, and nodes k0s-fleet left
        cordoned with no request of a live NodePlan on them: clear and uncordon."""
        busy_nodes = {(v.plan.ref.namespace, v.plan.cluster, v.plan.node)
                      for v in self.views.values() if v.in_flight}
        for ckey in sorted(self.s.nodes):
            nodes = self.s.nodes[ckey]
            if nodes is None or self.cluster(*ckey) is None:
                continue
            for name in sorted(nodes):
                node = nodes[name]
                sig = node.signal
                orphan = False
                if sig is not None:
                    ns, _, pname = sig.planId.partition("/")
                    orphan = ns == ckey[0] and (ns, pname) not in self.s.nodeplans
                    if orphan and (sig.status is None or not sig.status.status.terminal):
                        self.emit(ClearSignal(ckey, name, node.kind, "agent", sig.planId))
                        continue
                if node.cordoned_by is None or not (sig is None or orphan):
                    continue
                if (*ckey, name) in busy_nodes:
                    continue
                self.emit(UncordonNode(ckey, name))

    # -- sequencing --------------------------------------------------------------------
    def _machine_unavailable(self, m: MachineInfo, target: str | None,
                             nodes: dict[str, NodeInfo] | None) -> str | None:
        """Why this Machine counts against the budget right now (None: it does not)."""
        views = self.by_machine.get((m.ref.namespace, m.ref.name), [])
        if any(v.in_flight for v in views):
            return "upgrading"
        if target is not None and any(v.failed and same_version(v.plan.version, target)
                                      for v in views):
            return "failed"
        if m.deleting:
            return "deleting"
        if nodes is None:
            return "cluster unreachable"
        node = nodes.get(m.node_name)
        if node is None:
            return "no node"
        if self._carries_live_request(node):
            return "busy"  # e.g. a request whose NodePlan failed its deadline still runs
        if not node.ready:
            return "NotReady"
        if node.unschedulable:
            return "unschedulable"
        return None

    def _has_plan_for(self, m: MachineInfo, target: str) -> bool:
        return (m.ref.namespace, nodeplan_name(m.ref.name, target)) in self.views

    def _failed_for(self, owner: ObjectRef, target: str | None) -> list[PlanView]:
        return [v for v in self.views_by_owner.get((owner.namespace, owner.kind, owner.name), ())
                if v.failed and not v.plan.deleting and same_version(v.plan.version, target)]

    def _control_plane(self, kcp: ControlPlaneInfo) -> None:
        ns = kcp.ref.namespace
        ckey: ClusterKey = (ns, kcp.cluster)
        cluster = self.cluster(*ckey)
        nodes = self.nodes(ckey)
        machines = [m for m in self.machines_by_owner.get(kcp.ref, []) if m.cluster == kcp.cluster]
        target = _valid_version(kcp.version)
        if target is None:
            self._invalid_target(kcp.ref, kcp.version, kcp.status, len(machines))
            return
        live = [m for m in machines if not m.deleting]
        elig = {m.ref.name: control_plane_eligibility(m, kcp) for m in live}
        updated = sum(1 for e in elig.values() if e.up_to_date)
        unavailable = {m.ref.name: r for m in machines
                       if (r := self._machine_unavailable(m, target, nodes)) is not None}
        missing = max(0, kcp.replicas - len(live))
        budget = UnavailabilityBudget.one()
        failed = self._failed_for(kcp.ref, target)
        halted = len(failed) >= max(1, self.settings.halt_at_failures)
        not_in_place = {n: e for n, e in elig.items() if not e.up_to_date and not e.in_place}
        in_flight = [m.ref.name for m in machines
                     if any(v.in_flight for v in self.by_machine.get((ns, m.ref.name), []))]

        blocked = (f"Cluster {kcp.cluster} not found" if cluster is None
                   else f"workload cluster {kcp.cluster} unreachable" if nodes is None
                   else f"Cluster {kcp.cluster} is paused" if cluster.paused
                   else "halted: failure budget exceeded" if halted else "")
        policy_hold = self.hold(ckey, kcp.ref)
        if isinstance(policy_hold, ExtensionDrives) and enrolled(kcp):
            # CAPI's in-place updates (our extension) are for workers; control planes of a
            # cluster under a FleetUpgrade are k0s-fleet's own (paused executor).
            policy_hold = policy_hold.inner
        step = version_step(kcp, hold=policy_hold if enrolled(kcp) else None,
                            write_blocked=blocked)
        self.emit(*step.actions)
        driver = other_driver(kcp, live, autopilot_plan=self.s.autopilot_plans.get(ckey))
        release = release_pause(kcp, live, in_flight=bool(in_flight))
        if release is not None:
            self.emit(release)

        waiting = ""
        dispatched: list[str] = []
        candidates = [m for m in live if elig[m.ref.name].in_place
                      and not self._has_plan_for(m, target)]
        if candidates:
            if cluster is None or nodes is None or blocked:
                waiting = blocked
            elif step.waiting:
                waiting = step.waiting
            elif driver is not None:
                waiting = f"held: {driver.message}"
            elif policy_hold is not None:
                waiting = f"held: {policy_hold or 'paused'}"
            elif self._control_plane_busy(ns, kcp.cluster):
                waiting = "another control plane is being upgraded"
            elif unavailable or missing:
                why = ", ".join(f"{n} {r}" for n, r in sorted(unavailable.items()))
                if missing:
                    why = ", ".join(x for x in (why, f"{missing} replica(s) missing") if x)
                waiting = f"waiting for every control plane to be available ({why})"
            else:
                m = candidates[0]
                node = nodes.get(m.node_name)
                assert node is not None  # available implies present
                self.emit(CreateNodePlan(
                    cluster=ckey, owner=kcp.ref, machine=m.ref, node=node.name,
                    node_kind=node.kind, role=ROLE_CONTROLLER, version=target,
                    executor=cluster.executor, reason="oldest out-of-date control plane"))
                dispatched.append(m.ref.name)
                in_flight.append(m.ref.name)
        counts = RolloutCounts(
            target_version=target, updated=updated, total=len(live), in_flight=len(in_flight),
            failed=len(failed), unavailable=len(unavailable) + missing + len(dispatched),
            max_unavailable=budget.limit, not_in_place=len(not_in_place), halted=halted)
        self._rollout_status(kcp.ref, kcp.status, counts, not_in_place=not_in_place,
                             failed=failed, waiting=waiting, in_flight=in_flight,
                             budget_problem=None,
                             extra=self._writer_conditions(kcp.ref, kcp.status, step, driver))
        self.decisions.append(Decision(kcp.ref, target, updated, len(live), counts.unavailable,
                                       budget.limit, tuple(dispatched), waiting))

    def _workers_blocked(self, ns: str, cluster: str, target: str) -> str:
        """Why workers of this cluster must wait for its control planes ('' = they need not)."""
        cps = self.kcps_by_cluster.get((ns, cluster), [])
        oldest: K0sVersion | None = None
        for kcp in cps:
            kt = _valid_version(kcp.version)
            for m in self.machines_by_owner.get(kcp.ref, []):
                if m.deleting:
                    continue
                if kt is None or not same_version(m.version, kt):
                    return f"control plane {m.ref.name} is not yet on {kt or kcp.version}"
                v = K0sVersion.parse(kt)
                oldest = v if oldest is None or v < oldest else oldest
        if self._control_plane_busy(ns, cluster):
            return "a control plane is being upgraded"
        if oldest is not None and K0sVersion.parse(target) > oldest:
            return f"workers may not run a newer version ({target}) than control planes ({oldest})"
        return ""

    def _deployment(self, md: MachineDeploymentInfo) -> None:
        ns = md.ref.namespace
        ckey: ClusterKey = (ns, md.cluster)
        cluster = self.cluster(*ckey)
        nodes = self.nodes(ckey)
        machines = [m for m in self.machines_by_owner.get(md.ref, []) if m.cluster == md.cluster]
        target = _valid_version(md.version)
        if target is None:
            self._invalid_target(md.ref, md.version, md.status, len(machines))
            return
        live = [m for m in machines if not m.deleting]
        elig: dict[str, Eligibility] = {
            m.ref.name: machine_deployment_eligibility(
                m, md, self.s.machine_sets.get((ns, m.machine_set or "")))
            for m in live}
        updated = sum(1 for e in elig.values() if e.up_to_date)
        budget_problem: tuple[str, str] | None = None
        if md.strategy == "OnDelete":
            # Cluster API's OnDelete has no maxUnavailable: it replaces a Machine only once
            # someone deletes it (its own budget is 0), so nothing is taken down in place.
            budget = UnavailabilityBudget(0, "OnDelete")
            budget_problem = (C.R_MAX_UNAVAILABLE_ZERO,
                              "rollout strategy OnDelete: Cluster API takes no Machine down "
                              "by itself (maxUnavailable is 0 there), so k0s-fleet upgrades "
                              "none in place; delete Machines to have them replaced, or use "
                              "RollingUpdate with a maxUnavailable")
        else:
            try:
                budget = UnavailabilityBudget.resolve(md.max_unavailable, md.replicas)
            except InvalidMaxUnavailableError as e:
                budget = UnavailabilityBudget(0, str(md.max_unavailable))
                budget_problem = (C.R_INVALID_MAX_UNAVAILABLE, str(e))
            else:
                if budget.impossible:
                    budget_problem = (C.R_MAX_UNAVAILABLE_ZERO,
                                      f"maxUnavailable resolves to 0 (from {budget.source!r} of "
                                      f"{md.replicas} replicas): in-place upgrade impossible")
        unavailable = {m.ref.name: r for m in machines
                       if (r := self._machine_unavailable(m, target, nodes)) is not None}
        missing = max(0, md.replicas - len(live))
        failed = self._failed_for(md.ref, target)
        halted = len(failed) >= max(1, self.settings.halt_at_failures)
        not_in_place = {n: e for n, e in elig.items() if not e.up_to_date and not e.in_place}
        in_flight = [m.ref.name for m in machines
                     if any(v.in_flight for v in self.by_machine.get((ns, m.ref.name), []))]
        candidates = [m for m in live if elig[m.ref.name].in_place
                      and not self._has_plan_for(m, target) and m.ref.name not in unavailable]
        blocked_nodes = [m for m in live if elig[m.ref.name].in_place
                         and not self._has_plan_for(m, target) and m.ref.name in unavailable]

        sets = self.sets_by_deployment.get((ns, md.ref.name), [])
        blocked = (budget_problem[1] if budget_problem is not None
                   else f"Cluster {md.cluster} not found" if cluster is None
                   else f"workload cluster {md.cluster} unreachable" if nodes is None
                   else f"{'Cluster' if cluster.paused else 'MachineDeployment'} is paused"
                   if cluster.paused or md.paused
                   else "halted: failure budget exceeded" if halted else "")
        step = VersionStep()
        policy_hold = self.hold(ckey, md.ref)
        capi_drives = isinstance(policy_hold, ExtensionDrives)
        if enrolled(md):
            write_hold = policy_hold.inner if isinstance(policy_hold, ExtensionDrives) \
                else policy_hold
            step = version_step(md, hold=write_hold, write_blocked=blocked or (
                self._workers_blocked(ns, md.cluster, target)), pause=not capi_drives)
            self.emit(*step.actions)
            self._finish_paused_deployment(md, target, live, sets, elig,
                                           in_flight=bool(in_flight) or missing > 0)
        # Where Cluster API drives the workers through our extension, its MachineSets and
        # in-place annotations are the intended driver, not another one.
        driver = None if capi_drives else other_driver(
            md, machines, sets, autopilot_plan=self.s.autopilot_plans.get(ckey))

        waiting = ""
        dispatched: list[str] = []
        if candidates or blocked_nodes:
            if budget_problem is not None:
                waiting = budget_problem[1]
            elif cluster is None:
                waiting = f"Cluster {md.cluster} not found"
            elif nodes is None:
                waiting = f"workload cluster {md.cluster} unreachable"
            elif cluster.paused or md.paused:
                waiting = f"{'Cluster' if cluster.paused else 'MachineDeployment'} is paused"
            elif halted:
                waiting = "halted: failure budget exceeded"
            elif step.waiting:
                waiting = step.waiting
            elif driver is not None:
                waiting = f"held: {driver.message}"
            elif policy_hold is not None:
                waiting = f"held: {policy_hold or 'paused'}"
            elif blocked := self._workers_blocked(ns, md.cluster, target):
                waiting = blocked
            else:
                room = budget.room(len(unavailable) + missing)
                for m in candidates[:room]:
                    node = nodes.get(m.node_name)
                    assert node is not None
                    self.emit(CreateNodePlan(
                        cluster=ckey, owner=md.ref, machine=m.ref, node=node.name,
                        node_kind=node.kind, role=m.role, version=target,
                        executor=cluster.executor, reason="within maxUnavailable"))
                    dispatched.append(m.ref.name)
                    in_flight.append(m.ref.name)
                if len(candidates) > room:
                    waiting = (f"{len(unavailable) + missing + len(dispatched)} unavailable of "
                               f"maxUnavailable {budget.limit}")
                elif not candidates:
                    waiting = "waiting for nodes to become available: " + ", ".join(
                        f"{m.ref.name} {unavailable[m.ref.name]}" for m in blocked_nodes)
        counts = RolloutCounts(
            target_version=target, updated=updated, total=len(live), in_flight=len(in_flight),
            failed=len(failed), unavailable=len(unavailable) + missing + len(dispatched),
            max_unavailable=budget.limit, not_in_place=len(not_in_place), halted=halted)
        self._rollout_status(md.ref, md.status, counts, not_in_place=not_in_place,
                             failed=failed, waiting=waiting, in_flight=in_flight,
                             budget_problem=budget_problem,
                             extra=self._writer_conditions(md.ref, md.status, step, driver))
        self.decisions.append(Decision(md.ref, target, updated, len(live), counts.unavailable,
                                       budget.limit, tuple(dispatched), waiting))

    def _finish_paused_deployment(self, md: MachineDeploymentInfo, target: str,
                                  live: list[MachineInfo], sets: list[MachineSetInfo],
                                  elig: dict[str, Eligibility], *, in_flight: bool) -> None:
        """The end of the paused in-place sequence of an MD, once every node runs the
        target: pause the Machines' MachineSet (its controller would re-apply the old
        Machine versions from a reconcile in flight), move the MachineSet's template and
        the Machines' versions to the target, then release both pauses; each step waits
        until the previous one is observed."""
        if md.paused_for is None or not md.capi_paused or in_flight \
                or not same_version(md.object_version, target):
            return
        if not all(elig[m.ref.name].up_to_date for m in live):
            return
        owning = {m.machine_set for m in live}
        mine = [ms for ms in sets if ms.ref.name in owning]
        behind = [m for m in live if not same_version(m.version, target)]
        sets_behind = [ms for ms in mine if not same_version(ms.version, target)]
        if behind or sets_behind:
            unpaused = [ms for ms in mine if not ms.capi_paused]
            if unpaused:
                self.emit(*(PauseObject(ms.ref, target) for ms in unpaused))
                return
            if any(ms.paused_for is None for ms in mine):
                return  # a MachineSet paused by someone else: not ours to move
            for m in behind:
                self.emit(PatchMachineVersion(m.ref, target))
            for ms in sets_behind:
                self.emit(PatchMachineSetVersion(ms.ref, target))
            return
        for ms in mine:
            if ms.paused_for is not None:
                self.emit(ReleasePause(ms.ref, target))
        release = release_pause(md, live, in_flight=in_flight, machine_sets=mine)
        if release is not None:
            self.emit(release)

    def _writer_conditions(self, ref: ObjectRef, status: RolloutStatus, step: VersionStep,
                           driver: OtherDriver | None) -> tuple[Condition, ...]:
        """VERSION_WRITER (enrolled objects) and OTHER_DRIVER, with their Events."""
        out: list[Condition] = []
        if step.writer is not None:
            w = Condition(C.VERSION_WRITER, *step.writer[:2], _truncate(step.writer[2]))
            if w.status == "False" and not w.same_as(status.condition(C.VERSION_WRITER)):
                self.emit(ReportVersionConflict(ref, w.message))
            out.append(w)
        if driver is not None:
            d = Condition(C.OTHER_DRIVER, "True", driver.reason, _truncate(driver.message))
            if not d.same_as(status.condition(C.OTHER_DRIVER)):
                self.emit(ReportOtherDriver(ref, driver.reason, d.message))
            out.append(d)
        elif step.writer is not None or status.condition(C.OTHER_DRIVER) is not None:
            out.append(Condition(C.OTHER_DRIVER, "False", C.R_NO_OTHER_DRIVER, ""))
        return tuple(out)

    # -- status ------------------------------------------------------------------------
    def _invalid_target(self, ref: ObjectRef, version: str | None, status: RolloutStatus,
                        total: int) -> None:
        message = f"target version {version!r} is not a k0s version"
        conds = (
            Condition(C.UP_TO_DATE, "False", C.R_INVALID_VERSION, message),
            Condition(C.PROGRESSING, "False", C.R_INVALID_VERSION, message),
            Condition(C.HALTED, "False", C.R_WITHIN_BUDGET, ""),
            Condition(C.IN_PLACE, "False", C.R_INVALID_VERSION, message),
        )
        counts = RolloutCounts(str(version or ""), 0, total, 0, 0, 0, 0, total, False)
        self._set_status(ref, status, conds, counts)
        if not conds[3].same_as(status.condition(C.IN_PLACE)):
            self.emit(ReportNotInPlace(ref, C.R_INVALID_VERSION, message))

    def _rollout_status(self, ref: ObjectRef, status: RolloutStatus, counts: RolloutCounts, *,
                        not_in_place: dict[str, Eligibility], failed: list[PlanView],
                        waiting: str, in_flight: Iterable[str],
                        budget_problem: tuple[str, str] | None,
                        extra: tuple[Condition, ...] = ()) -> None:
        target, done = counts.target_version, counts.updated == counts.total
        summary = f"{counts.updated}/{counts.total} machines on {target}"
        if done:
            up = Condition(C.UP_TO_DATE, "True", C.R_UP_TO_DATE, summary)
        elif counts.halted:
            up = Condition(C.UP_TO_DATE, "False", C.R_HALTED, summary)
        elif counts.in_flight:
            up = Condition(C.UP_TO_DATE, "False", C.R_UPGRADING, summary)
        else:
            up = Condition(C.UP_TO_DATE, "False", C.R_WAITING,
                           _truncate(f"{summary}; {waiting}" if waiting else summary))
        names = sorted(set(in_flight))
        if names:
            prog = Condition(C.PROGRESSING, "True", C.R_NODES_UPGRADING,
                             _truncate("upgrading " + ", ".join(names)
                                       + (f"; {waiting}" if waiting else "")))
        else:
            prog = Condition(C.PROGRESSING, "False", C.R_WAITING if waiting else C.R_IDLE,
                             _truncate(waiting))
        if counts.halted:
            failed_names = ", ".join(sorted(v.plan.ref.name for v in failed))
            halt_msg = _truncate(
                f"{len(failed)} failed node upgrade(s) reached the failure budget of "
                f"{self.settings.halt_at_failures}: {failed_names}; annotate the object or the "
                f"NodePlans with {ANN_RETRY}=<anything> to retry, or delete the NodePlans")
            halt = Condition(C.HALTED, "True", C.R_HALTED, halt_msg)
        else:
            halt = Condition(C.HALTED, "False", C.R_WITHIN_BUDGET, "")
        if budget_problem is not None and not done:
            inplace = Condition(C.IN_PLACE, "False", budget_problem[0],
                                _truncate(budget_problem[1]))
        elif not_in_place:
            text = "; ".join(f"{n}: {e.reason}" for n, e in sorted(not_in_place.items()))
            inplace = Condition(C.IN_PLACE, "False", C.R_NOT_IN_PLACE,
                                _truncate(f"not in-place (left to Cluster API): {text}"))
        else:
            inplace = Condition(C.IN_PLACE, "True", C.R_IN_PLACE, "")
        conds = (up, prog, halt, inplace, *extra)
        self._set_status(ref, status, conds, counts)
        if halt.status == "True" and not halt.same_as(status.condition(C.HALTED)):
            self.emit(HaltObject(ref, failed=len(failed), budget=self.settings.halt_at_failures,
                                 message=halt.message))
        if inplace.status == "False" and not inplace.same_as(status.condition(C.IN_PLACE)):
            self.emit(ReportNotInPlace(ref, inplace.reason, inplace.message))

    def _set_status(self, ref: ObjectRef, status: RolloutStatus, conds: tuple[Condition, ...],
                    counts: RolloutCounts) -> None:
        same_conds = all(c.same_as(status.condition(c.type)) for c in conds)
        # status.k0sFleet only survives where the CRD keeps unknown status fields (Cluster
        # API's own CRDs prune it); then only a condition change is worth a write, and the
        # UpToDate message carries updated/total.
        if same_conds and (not status.counts or dict(status.counts) == counts.as_status()):
            return
        self.emit(SetRolloutStatus(ref, conds, counts))
