"""NodePlan upkeep, the first job of a planning pass: follow every NodePlan's request on
its node (start, signal, mirror the node's state, deadlines, completion, retries,
deletion) and record each plan's effective state (:class:`~fleet.planner.state.PlanView`)
for sequencing."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import SignalState
from fleet.contract.versions import valid_version
from fleet.planner import conditions as C
from fleet.planner.actions import (
    AnnotateWorkerVersion,
    ClearSignal,
    MarkNodePlanFailed,
    PatchMachineVersion,
    ReleaseNodePlan,
    RemoveAnnotation,
    RetryNodePlan,
    SignalNode,
    StartNodePlan,
    UncordonNode,
    UpdateNodePlanStatus,
)
from fleet.planner.settings import COMPLETING, PENDING
from fleet.planner.state import (
    PHASE_DELETING,
    NodeRequest,
    PassState,
    PlanView,
    Unsent,
    deployment_budget,
)
from fleet.world.eligibility import (
    completion_deferred,
    same_version,
)
from fleet.world.executors import EXECUTORS, executor, request_for
from fleet.world.model import (
    ANN_RETRY,
    KIND_MD,
    NODEPLAN_FINALIZER,
    ROLE_CONTROLLER,
    ClusterKey,
    Condition,
    NodeInfo,
    NodePlanInfo,
    ObjectRef,
    truncate,
)


class NodePlanUpkeep(PassState):
    # -- NodePlan upkeep ---------------------------------------------------------------
    def _request_state(self, p: NodePlanInfo, node: NodeInfo | None) -> NodeRequest | None:
        """The node's answer to exactly this request (plan id + created), or None."""
        if node is None or p.started_at is None:
            return None
        carried = executor(p.executor).carried(node)
        if carried is None or not carried.is_request(p.plan_id, p.started_at,
                                                     max(1, p.attempts)):
            return None
        return NodeRequest(carried.state, carried.reason, carried.at, carried.drain)

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
                self._mark_completed(p, node, req)
                return
            self._add_view(p, NodePlanPhase.FAILED)
            return

        # Pending or InProgress.
        down = self._unreachable(ckey)
        at = None  # when the node entered node_state, by its own clock
        if down is not None and p.phase != NodePlanPhase.PENDING:
            # What the node does is unknown: keep its last known state (the deadline keeps
            # running from it) and say why nothing is known, rather than blame the node.
            node_state = p.node_state
            phase = p.phase
            state_key = (COMPLETING if node_state == SignalState.COMPLETED.value
                         else node_state or PENDING)
            message = f"{down}; last known node state {node_state or phase}"
            at = p.node_state_at
        elif p.phase == NodePlanPhase.IN_PROGRESS and self.s.nodes.get(ckey) is None:
            # Its cluster not listed yet (a controller just started) and not known to be
            # down: the node's state is unknown, not gone; keep the plan as it stands.
            self._add_view(p, p.phase)
            return
        elif req is None:
            # Not on the node yet: whether it may go out now is decided once every
            # NodePlan's view is known (_send_requests), since it takes a node down.
            phase = NodePlanPhase.PENDING if p.phase == NodePlanPhase.PENDING else p.phase
            self.unsent.append(Unsent(p, ckey, node, self._add_view(p, phase)))
            return
        elif req.state is None:
            state_key, phase, node_state, message = PENDING, NodePlanPhase.PENDING, "", \
                "signalled; waiting for the node to answer"
        elif req.state.failed:
            self.emit(MarkNodePlanFailed(
                p.ref, reason=C.R_NODE_FAILED, node_state=req.state.value,
                message=truncate(f"node {p.node}: {req.state.value}"
                                  + (f": {req.reason}" if req.reason else "")),
                drain=req.drain))
            self._add_view(p, NodePlanPhase.FAILED)
            return
        elif req.state == SignalState.COMPLETED:
            if node is not None and node.available and version_ok:
                self._mark_completed(p, node, req)
                return
            state_key, phase, node_state, at = COMPLETING, NodePlanPhase.IN_PROGRESS, \
                SignalState.COMPLETED.value, req.at
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
            state_key, phase, node_state, at = req.state.value, NodePlanPhase.IN_PROGRESS, \
                req.state.value, req.at
            message = req.reason or f"node {p.node}: {req.state.value}"

        self._follow(p, self._add_view(p, phase), state_key=state_key, phase=phase,
                     node_state=node_state, message=message, dispatched=req is not None, at=at)

    def _follow(self, p: NodePlanInfo, view: PlanView, *, state_key: str, phase: str,
                node_state: str, message: str, dispatched: bool, held: bool = False,
                at: datetime | None = None) -> None:
        """Write what changed into the NodePlan's status and run its deadline.

        ``held``: its request waits for the owner's budget; no deadline runs meanwhile,
        and it starts afresh when the hold ends. ``at``: when the node entered
        ``node_state``, by its own clock.

        A new phase (or hold) is written at once; a new step (or message) within the
        phase once the node has stayed in it for status_settle, so quick steps cost no
        write. A step the status cannot date on its own (no node clock) is written now.
        """
        was_held = self._was_held(p)
        if held != was_held:
            since, dated = self.now, False
        else:
            since, dated = self._state_since(p, node_state, at)
        if not held:
            limit = self.settings.deadline(state_key)
            clock = self._pending_clock(p, since) if state_key == PENDING else since
            if self.now >= clock + limit:
                self.emit(MarkNodePlanFailed(
                    p.ref, reason=C.R_DEADLINE, node_state=node_state, deadline=True,
                    message=truncate(
                        f"no progress in {state_key} for {int(limit.total_seconds())}s "
                        f"(deadline): {message}")))
                view.phase, view.in_flight, view.failed = NodePlanPhase.FAILED, False, True
                return
            self.wake(clock + limit)
        if (phase, node_state, message) == (p.phase, p.node_state, p.message) \
                and held == was_held:
            return
        settled = since + self.settings.status_settle
        if phase != p.phase or held != was_held or not dated or self.now >= settled:
            self.emit(UpdateNodePlanStatus(
                p.ref, phase=phase, node_state=node_state, message=truncate(message),
                phase_since=min(since, self.now), completed_at=None, running_version=None,
                conditions=self._plan_conditions(p, phase, message, dispatched=dispatched,
                                                 held=held),
                node_state_at=at))
        else:
            self.wake(settled)

    def _state_since(self, p: NodePlanInfo, node_state: str, at: datetime | None
                     ) -> tuple[datetime, bool]:
        """When the node entered ``node_state``, by our clock, and whether that is known
        without writing it down (the NodePlan's status dates it, or it dates the node's own
        timestamp: ``phaseSince`` and ``nodeStateAt`` name one instant on both clocks, so
        the node's clock is read against ours whatever their skew). That instant may lie
        ahead of ``now`` (the node's clock ran faster than ours since): the deadline and
        the status write are counted from it all the same, so that a later pass (or an
        incremental planner keeping this one's wake-up) decides the same; only a written
        ``phaseSince`` is never in the future."""
        recorded = p.phase_since or p.started_at or self.now
        if at is not None and p.node_state_at is not None:
            return max(recorded + (at - p.node_state_at), recorded), True
        if node_state == p.node_state:
            return recorded, True
        return self.now, False

    def _pending_clock(self, p: NodePlanInfo, since: datetime) -> datetime:
        """Where a request's pending deadline counts from: when it went pending, or when
        this controller began acting on its cluster if later. A request a killed
        controller created but never sent, or sent just before it died, is not failed by
        the next one for the time no controller was acting; a silent node still is,
        one pending deadline later."""
        info = self.cluster(p.ref.namespace, p.cluster)
        acting = info.acting_since if info is not None else None
        return since if acting is None else max(since, acting)

    @staticmethod
    def _was_held(p: NodePlanInfo) -> bool:
        """Its status says its request waits for the owner's budget."""
        return any(c.type == C.NP_DISPATCHED and c.reason == C.R_WAITING_FOR_BUDGET
                   for c in p.conditions)

    # -- sending requests: the moment a node is taken down -----------------------------
    def _send_requests(self) -> None:
        """Signal the NodePlans whose request is not on their node yet, each only if its
        owner's budget still allows taking that node down: peers may have gone
        unavailable since the NodePlan was created (a lost signal write, or a NodePlan
        the UpdateMachine hook created). Oldest Machine first within an owner."""
        waiting = {(u.plan.ref.namespace, u.plan.ref.name) for u in self.unsent}
        for u in sorted(self.unsent, key=self._unsent_order):
            p, ckey, node = u.plan, u.ckey, u.node
            message = self._pending_message(p, ckey, node)
            sendable = node is not None and p.started_at is not None \
                and not self._node_busy_with_other(p, node)
            unsent_since = self._pending_clock(p, p.phase_since or p.started_at or self.now)
            # A request whose plan misses its deadline in this very pass is not sent: the
            # plan is marked failed, and a node signalled now would be busy while no
            # in-flight plan counts it against the budget. A hold ending restarts it.
            in_time = bool(p.node_state) or self._was_held(p) \
                or self.now < unsent_since + self.settings.deadline(PENDING)
            held = None
            if sendable and node is not None:
                held = self._budget_hold(p, ckey, node, waiting)
                if held is None and in_time:
                    self._ensure_signalled(p, ckey, node)
                    waiting.discard((p.ref.namespace, p.ref.name))
            self._follow(p, u.view, state_key=PENDING, phase=u.view.phase, node_state="",
                         message=held or message, dispatched=False, held=held is not None)

    def _unsent_order(self, u: Unsent) -> tuple[object, ...]:
        m = self.s.machines.get((u.plan.ref.namespace, u.plan.machine))
        return (u.plan.ref.namespace, u.plan.owner_kind, u.plan.owner_name,
                m.sort_key() if m is not None else (), u.plan.ref.name)

    def _budget_hold(self, p: NodePlanInfo, ckey: ClusterKey, node: NodeInfo,
                     waiting: set[tuple[str, str]]) -> str | None:
        """Why sending ``p``'s request now would take more down than its owner allows
        (None: it may go). ``waiting``: NodePlans whose request is not out (not counted)."""
        if not node.ready or node.unschedulable:
            return None  # its node is down already: the request takes nothing more down
        nodes = self.nodes(ckey)
        ns = p.ref.namespace
        if p.role == ROLE_CONTROLLER:
            down: list[str] = []
            for kcp in self.kcps_by_cluster.get(ckey, []):
                if kcp.hosted:
                    continue  # its pods are k0smotron's, not nodes of the cluster
                machines = self.machines_by_owner.get(kcp.ref, [])
                down += [f"{m.ref.name} {r}" for m in machines if m.ref.name != p.machine
                         and (r := self._machine_unavailable(
                             m, valid_version(kcp.version), nodes, unsent=waiting)) is not None]
                if (missing := kcp.replicas - sum(1 for m in machines if not m.deleting)) > 0:
                    down.append(f"{missing} replica(s) of {kcp.ref.name} missing")
            if not down:
                return None
            return truncate("held: not signalled while another control plane is unavailable "
                            f"({', '.join(sorted(down))})")
        if p.owner_kind != KIND_MD or (md := self.s.deployments.get((ns, p.owner_name))) is None:
            return None
        budget, _ = deployment_budget(md)
        machines = self.machines_by_owner.get(md.ref, [])
        target = valid_version(md.version)
        others = {m.ref.name: r for m in machines if m.ref.name != p.machine
                  and (r := self._machine_unavailable(m, target, nodes, unsent=waiting))
                  is not None}
        missing = max(0, md.replicas - sum(1 for m in machines if not m.deleting))
        if len(others) + missing + 1 <= budget.limit:
            return None
        why = [f"{n} {r}" for n, r in sorted(others.items())]
        if missing:
            why.append(f"{missing} replica(s) missing")
        return truncate(f"held: {len(others) + missing} unavailable of maxUnavailable "
                        f"{budget.limit} ({', '.join(why)}); signalled once one is back")

    def _pending_message(self, p: NodePlanInfo, ckey: ClusterKey,
                         node: NodeInfo | None) -> str:
        if (down := self._unreachable(ckey)) is not None:
            return down
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
                         dispatched: bool, held: bool = False) -> tuple[Condition, ...]:
        return (
            Condition(C.NP_DISPATCHED, "True" if dispatched else "False",
                      C.R_SIGNALLED if dispatched
                      else C.R_WAITING_FOR_BUDGET if held else C.R_NOT_SIGNALLED,
                      "" if dispatched else truncate(message)),
            Condition(C.NP_COMPLETED, "True" if phase == NodePlanPhase.COMPLETED else "False",
                      C.R_COMPLETED if phase == NodePlanPhase.COMPLETED else C.R_IN_PROGRESS,
                      ""),
            Condition(C.NP_FAILED, "False", C.R_IN_PROGRESS, ""),
        )

    def _mark_completed(self, p: NodePlanInfo, node: NodeInfo,
                        req: NodeRequest | None) -> None:
        message = f"node {p.node} runs {p.version} and is Ready"
        at = req.at if req is not None else None
        self.emit(UpdateNodePlanStatus(
            p.ref, phase=NodePlanPhase.COMPLETED, node_state=SignalState.COMPLETED.value,
            message=message, phase_since=self.now, completed_at=self.now,
            running_version=node.running_version or p.version,
            conditions=self._plan_conditions(p, NodePlanPhase.COMPLETED, message,
                                             dispatched=True), node_state_at=at,
            drain=req.drain if req is not None else ()))
        self._add_view(p, NodePlanPhase.COMPLETED).recording = True
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
            md = self.s.deployments.get((p.ref.namespace, p.owner_name)) \
                if p.owner_kind == KIND_MD else None
            if md is not None and completion_deferred(md, p.version):
                return  # recorded with its spec.version at the end of the paused sequence
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


    def _owner_retries(self) -> None:
        """The retry annotation on an MD/KCP retries its Failed NodePlans for the target."""
        owners: list[tuple[ObjectRef, str | None, dict[str, str]]] = [
            (md.ref, md.version, dict(md.annotations)) for md in self.s.deployments.values()
        ] + [(k.ref, k.version, dict(k.annotations)) for k in self.s.control_planes.values()]
        for ref, version, anns in sorted(owners, key=lambda o: o[0]):
            token = anns.get(ANN_RETRY)
            if token is None:
                continue
            target = valid_version(version)
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
                    orphan = ns == ckey[0] and (ns, pname) not in self.s.nodeplans \
                        and (ns, pname) not in self.s.other_nodeplans
                    if orphan and (sig.status is None or not sig.status.status.terminal):
                        self.emit(ClearSignal(ckey, name, node.kind, "agent", sig.planId))
                        continue
                if node.cordoned_by is None or not (sig is None or orphan):
                    continue
                if (*ckey, name) in busy_nodes:
                    continue
                self.emit(UncordonNode(ckey, name))
