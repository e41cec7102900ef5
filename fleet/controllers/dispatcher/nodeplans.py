"""The NodePlan's life as the dispatcher writes it: created started (its request's trace
begun, its node signalled at once), started, retried, its status and its failure written,
its finalizer released, and the creates whose answer was lost settled.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from opentelemetry import trace

from fleet.config.downloads import DownloadResolutionError
from fleet.contract.nodeplan import TRACEPARENT_ANNOTATION, NodePlanPhase
from fleet.contract.signal import NodePolicy
from fleet.contract.tracecontext import k8s_attributes
from fleet.controllers.dispatcher.core import _condition_list
from fleet.controllers.dispatcher.nodes import NodeSignals
from fleet.dispatch import create_or_adopt_nodeplan, created_started, nodeplan_to_dispatch
from fleet.events import WARNING
from fleet.kube import KubeError, KubeObject, NotFoundError, UnreachableError
from fleet.kube.errors import ServerError
from fleet.kube.resources import CLUSTERS, MACHINE_DRAIN_RULES, MACHINES, NODE_PLANS
from fleet.planner import conditions as C
from fleet.planner.actions import (
    CreateNodePlan,
    MarkNodePlanFailed,
    ReleaseNodePlan,
    RetryNodePlan,
    SignalNode,
    StartNodePlan,
    UpdateNodePlanStatus,
)
from fleet.telemetry import context_from_traceparent, current_traceparent
from fleet.world.drainrules import DrainRuleError, rules_for_machine
from fleet.world.executors import request_for
from fleet.world.model import (
    KIND_CONTROL_NODE,
    NODEPLAN_FINALIZER,
    ClusterKey,
    Condition,
    NodePlanInfo,
    ObjectRef,
    format_time,
    nodeplan_from,
)

log = logging.getLogger(__name__)


def _failed_conditions(reason: str, message: str) -> tuple[Condition, ...]:
    return (Condition(C.NP_COMPLETED, "False", reason, ""),
            Condition(C.NP_FAILED, "True", reason, message))


class NodePlanWrites(NodeSignals):
    """The NodePlan writes (a NodePlan created signals its node at once: hence
    :class:`NodeSignals`)."""

    async def settle_unsure(self) -> bool:
        """Learn the fate of creates that got no answer (or a 5xx). False while that is
        unknown."""
        for key in sorted(self.unsure):
            try:
                obj = await self.mgmt.get_or_none(NODE_PLANS, key[1], key[0])
            except KubeError as e:
                log.warning("cannot tell whether NodePlan %s/%s exists: %s", *key, e)
                return False
            if obj is None:
                stale = self.view[NODE_PLANS].get(key[1], key[0])
                if stale is not None and not (stale.get("metadata") or {}).get("uid"):
                    self.view[NODE_PLANS].forget(stale)  # our provisional copy: never made
            self._remember(NODE_PLANS, obj)
            if obj is not None and not (obj.get("status") or {}).get("startedAt"):
                # Created started, never signalled (the create's answer was lost): its
                # request starts now, so its pending deadline does not count the time
                # its fate was unknown (as a create answered at once starts it).
                try:
                    await self._start(nodeplan_from(obj).ref, attempts=1,
                                      started_at=self.clock(), unsent=True)
                except KubeError as e:
                    log.warning("starting NodePlan %s/%s: %s", *key, e)
                    return False
            self.unsure.discard(key)
        return True

    # -- NodePlans -------------------------------------------------------------------------
    def _node_policy(self, machine: KubeObject, cluster: ClusterKey) -> NodePolicy:
        """The fleet's node policy with the MachineDrainRules that apply to ``machine``
        (where Cluster API serves them). Raises DrainRuleError for a rule that cannot be
        carried out as written."""
        policy = self.config.agent.node_policy()
        rules_cache = self.view.caches.get(MACHINE_DRAIN_RULES)
        if rules_cache is None:
            return policy
        meta = machine.get("metadata") or {}
        ns = str(meta.get("namespace") or "")
        found = self.view[CLUSTERS].get(cluster[1], cluster[0])
        rules = rules_for_machine(
            rules_cache.items(), namespace=ns, machine_labels=meta.get("labels") or {},
            cluster_labels=((found or {}).get("metadata") or {}).get("labels") or {})
        return policy.model_copy(update={"drainRules": rules}) if rules else policy

    async def _do_CreateNodePlan(self, a: CreateNodePlan) -> None:
        machine = self.view[MACHINES].get(a.machine.name, a.machine.namespace)
        if machine is None:
            return
        wc = self.registry.get(a.cluster)
        node = None
        if wc is not None:
            records = wc.control_nodes if a.node_kind == KIND_CONTROL_NODE else wc.nodes
            node = records.get(a.node)
        arch = node.info.arch if node is not None else None
        try:
            artifact = await self.artifacts.resolve(a.version, arch)
        except DownloadResolutionError as e:
            await self.event(a.owner, "DownloadUnresolved", f"{a.machine.name}: {e}",
                             type=WARNING)
            log.warning("%s: cannot dispatch %s: %s", a.owner, a.machine.name, e)
            return
        try:
            node_policy = self._node_policy(machine, a.cluster)
        except DrainRuleError as e:
            await self.event(a.owner, "DrainRuleInvalid", f"{a.machine.name}: {e}",
                             type=WARNING)
            log.warning("%s: cannot dispatch %s: %s", a.owner, a.machine.name, e)
            return
        with self.tracer.start_as_current_span(
                "node-upgrade.dispatch", context=trace.set_span_in_context(
                    trace.INVALID_SPAN),  # every node upgrade is a trace of its own
                attributes={**k8s_attributes(a.cluster[0], a.cluster[1], a.node),
                            "k0s_fleet.cluster": a.cluster[1], "k0s_fleet.node": a.node,
                            "k0s_fleet.machine": a.machine.name, "k0s_fleet.role": a.role,
                            "k0s_fleet.version": a.version, "k0s_fleet.owner": str(a.owner),
                            "k0s_fleet.executor": a.executor,
                            "k0s_fleet.reason": a.reason}):
            traceparent = current_traceparent()
        body = nodeplan_to_dispatch(
            machine=machine, node_name=a.node, role=a.role, version=a.version,
            artifact=artifact, executor=a.executor, owner_kind=a.owner.kind,
            owner_name=a.owner.name, traceparent=traceparent, node_policy=node_policy)
        key = (a.machine.namespace, body["metadata"]["name"])
        # Cached before it is sent: a pass planned while this request is on the wire must
        # count the node as dispatched already. That copy is not started (no request
        # identity), so no pass signals the node before the NodePlan exists.
        provisional = {**body, "metadata": {**body["metadata"],
                                            "creationTimestamp": format_time(self.clock())}}
        # Created started: the request's identity (attempt 1, created = started_at) is in
        # the object the create writes, so no status write has to record it before the
        # node is signalled (one request per node upgrade saved); a restart re-sends this
        # same request. The CRD defaults status.phase to Pending for `kubectl get`.
        body = created_started(body, at=self.clock(), reason=a.reason)
        cache = self.view[NODE_PLANS]
        if cache.get(key[1], key[0]) is None:
            cache.observe(provisional)
        try:
            outcome = await create_or_adopt_nodeplan(self.mgmt, body)
        except (UnreachableError, ServerError):
            # The create may have landed without us hearing back (no answer, or a 5xx
            # such as the API server's 504 while etcd still commits the write): until we
            # know, no pass may count this node as not dispatched (it would spend its
            # budget twice). A 429 is never committed: it is forgotten below.
            self.unsure.add(key)
            raise
        except KubeError:
            if cache.get(key[1], key[0]) is provisional:
                cache.forget(provisional)
            raise
        if not outcome.created:
            # Dispatched already (by us before a restart, or by the runtime extension):
            # make sure the cache knows, so the budget counts it.
            self.stats.already += 1
            if outcome.plan is None and cache.get(key[1], key[0]) is provisional:
                cache.forget(provisional)  # deleted meanwhile: the next pass decides again
            self._remember(NODE_PLANS, outcome.plan)
            return
        created = outcome.plan
        assert created is not None
        self.stats.creates += 1
        self.stats.writes += 1
        self._remember(NODE_PLANS, created)
        plan = nodeplan_from(created)
        # No Event for the dispatch (one request per node saved): the NodePlan is its
        # record (created started, its annotations say when and why).
        # Signal at once (the next pass would do the same, a round trip later).
        assert plan.started_at is not None
        await self._do_SignalNode(SignalNode(
            plan=plan.ref, cluster=a.cluster, node=a.node, node_kind=a.node_kind,
            executor=plan.executor, request=request_for(
                plan, created=plan.started_at, attempt=max(1, plan.attempts),
                traceparent=traceparent or "")))

    async def _start(self, ref: ObjectRef, *, attempts: int, started_at: datetime,
                     retry: bool = False, unsent: bool = False) -> KubeObject | None:
        """``unsent``: a NodePlan created started whose request was never sent (its create
        unanswered) gets a fresh start written, unless its status has one already."""
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            status = obj.get("status") or {}
            if unsent and status.get("startedAt"):
                return None
            if not retry and not unsent and nodeplan_from(obj).started:
                return None  # started already (by its status, or created started)
            if retry and status.get("phase") != NodePlanPhase.FAILED:
                return None  # nothing to retry (any more)
            traceparent = ((obj.get("metadata") or {}).get("annotations") or {}).get(
                TRACEPARENT_ANNOTATION, "")
            conds = (Condition(C.NP_DISPATCHED, "False", C.R_NOT_SIGNALLED, "signalling"),
                     Condition(C.NP_COMPLETED, "False", C.R_IN_PROGRESS, ""),
                     Condition(C.NP_FAILED, "False", C.R_IN_PROGRESS, ""))
            return {"status": {
                "phase": NodePlanPhase.PENDING, "nodeState": "", "attempts": attempts,
                "message": "retry requested" if retry else "dispatched",
                "startedAt": format_time(started_at), "phaseSince": format_time(started_at),
                "completedAt": None, "nodeStateAt": None, "traceparent": traceparent,
                "observedGeneration": (obj.get("metadata") or {}).get("generation"),
                "conditions": _condition_list(status.get("conditions") or [], conds,
                                              self.clock()),
            }}

        return await self._patch(self.mgmt, NODE_PLANS, ref.name, ref.namespace, mutate,
                                 subresource="status")

    async def _do_StartNodePlan(self, a: StartNodePlan) -> None:
        await self._start(a.plan, attempts=a.attempts, started_at=a.started_at)

    async def _do_RetryNodePlan(self, a: RetryNodePlan) -> None:
        obj = await self._start(a.plan, attempts=a.attempts, started_at=a.started_at,
                                retry=True)
        if obj is not None:
            await self.event(obj, "NodeUpgradeRetried", f"attempt {a.attempts} requested",
                             action="Retry")

    async def _do_UpdateNodePlanStatus(self, a: UpdateNodePlanStatus) -> None:
        now = self.clock()

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            status = obj.get("status") or {}
            phase = status.get("phase")
            late = phase == NodePlanPhase.FAILED and a.phase == NodePlanPhase.COMPLETED
            if phase in (NodePlanPhase.COMPLETED, NodePlanPhase.FAILED) and not late:
                return None  # terminal; only a late completion may still land
            patch: dict[str, Any] = {
                "phase": a.phase, "nodeState": a.node_state, "message": a.message,
                "phaseSince": format_time(a.phase_since or now),
                "conditions": _condition_list(status.get("conditions") or [], a.conditions,
                                              now)}
            if a.completed_at is not None:
                patch["completedAt"] = format_time(a.completed_at)
            patch["nodeStateAt"] = format_time(a.node_state_at) if a.node_state_at else None
            if a.running_version is not None:
                patch["runningVersion"] = a.running_version
            if a.drain:
                patch["drain"] = list(a.drain)
            return {"status": patch | _identity(obj)}

        obj = await self._patch(self.mgmt, NODE_PLANS, a.plan.name, a.plan.namespace, mutate,
                                subresource="status")
        if obj is not None and a.phase == NodePlanPhase.COMPLETED:
            # No Event: the Completed status (phase, message, startedAt, completedAt) is
            # the record of a node's success; an Event would repeat it (one more request
            # per node upgrade). Failures still get their Warning Event.
            self._trace_result(obj, "Completed", "")

    async def _do_MarkNodePlanFailed(self, a: MarkNodePlanFailed) -> None:
        now = self.clock()

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            status = obj.get("status") or {}
            if status.get("phase") in (NodePlanPhase.COMPLETED, NodePlanPhase.FAILED):
                return None
            return {"status": {
                "phase": NodePlanPhase.FAILED, "nodeState": a.node_state, "message": a.message,
                "phaseSince": format_time(now),
                "conditions": _condition_list(status.get("conditions") or [],
                                              _failed_conditions(a.reason, a.message), now),
                **({"drain": list(a.drain)} if a.drain else {}),
            } | _identity(obj)}

        obj = await self._patch(self.mgmt, NODE_PLANS, a.plan.name, a.plan.namespace, mutate,
                                subresource="status")
        if obj is not None:
            self._trace_result(obj, "Failed", a.message)
            p = nodeplan_from(obj)
            await self.event(obj, "NodeUpgradeFailed", a.message, type=WARNING,
                             related=p.owner_ref, action="Fail", key=_attempt_key(p))

    def _trace_result(self, obj: KubeObject, outcome: str, message: str) -> None:
        """One span covering a node upgrade from request to outcome, in its own trace."""
        p = nodeplan_from(obj)
        ctx = context_from_traceparent(p.traceparent or p.annotations.get(
            TRACEPARENT_ANNOTATION))
        start = p.started_at or p.created or self.clock()
        span = self.tracer.start_span(
            "node-upgrade", context=ctx, start_time=int(start.timestamp() * 1e9),
            attributes={**k8s_attributes(p.ref.namespace, p.cluster, p.node),
                        "k0s_fleet.cluster": p.cluster, "k0s_fleet.node": p.node,
                        "k0s_fleet.machine": p.machine, "k0s_fleet.role": p.role,
                        "k0s_fleet.version": p.version, "k0s_fleet.outcome": outcome,
                        "k0s_fleet.attempts": p.attempts, "k0s_fleet.nodeplan": p.plan_id})
        if outcome == "Failed":
            span.set_status(trace.Status(trace.StatusCode.ERROR, message))
        span.end()

    async def _do_ReleaseNodePlan(self, a: ReleaseNodePlan) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            fins = list((obj.get("metadata") or {}).get("finalizers") or [])
            if NODEPLAN_FINALIZER not in fins:
                return None
            return {"metadata": {"finalizers": [f for f in fins if f != NODEPLAN_FINALIZER]}}

        try:
            obj = await self._patch(self.mgmt, NODE_PLANS, a.plan.name, a.plan.namespace, mutate)
        except NotFoundError:
            return
        if obj is not None and not obj.get("metadata", {}).get("finalizers"):
            # Without finalizers a deleting object is gone; the watch will say so too.
            self.view[NODE_PLANS].forget(obj)


def _identity(obj: KubeObject) -> dict[str, Any]:
    """A NodePlan created started (its request's identity in its annotations) gets that
    identity into its status with its first status write (no request of its own), so
    ``status.startedAt`` and ``status.attempts`` say it from then on."""
    if ((obj.get("status") or {}).get("startedAt")):
        return {}
    p = nodeplan_from(obj)
    if p.started_at is None:
        return {}
    return {"startedAt": format_time(p.started_at), "attempts": max(1, p.attempts),
            "traceparent": p.traceparent or p.annotations.get(TRACEPARENT_ANNOTATION, "")}


def _attempt_key(p: NodePlanInfo) -> str:
    """Events of one attempt of a NodePlan: a retried attempt that ends with the same
    text is a new Event, not a duplicate (events.py dedupes on content + key)."""
    started = format_time(p.started_at) if p.started_at else ""
    return f"attempt {p.attempts} {started}"
