"""Act: perform the planner's actions against the API servers, idempotently.

Every write is either a create (AlreadyExists = someone did it already) or a
``patch_with_retry`` whose mutation re-checks, on the freshest object, that the change
is still wanted: performing an action twice, or after another controller did, changes
nothing. Whatever a write returns goes into the caches at once (write-through), so the
next planning pass sees it even before the watch does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
from opentelemetry import trace

from fleet.artifacts import ArtifactResolver
from fleet.config.downloads import DownloadResolutionError
from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import TRACEPARENT_ANNOTATION, NodePlanPhase, nodeplan_name
from fleet.contract.signal import (
    CORDONED_BY_KEY,
    SIGNAL_VERSION,
    NodePolicy,
    parse_signal,
)
from fleet.contract.tracecontext import k8s_attributes
from fleet.controllers.observe import ManagementView
from fleet.dispatch import create_or_adopt_nodeplan, created_started, nodeplan_to_dispatch
from fleet.events import NORMAL, WARNING, EventRecorder
from fleet.kube import (
    KubeClient,
    KubeError,
    KubeObject,
    NotFoundError,
    UnreachableError,
)
from fleet.kube.cache import ObjectCache, RecordCache
from fleet.kube.errors import ServerError
from fleet.kube.patch import patch_with_retry
from fleet.kube.resources import (
    CLUSTERS,
    CONTROL_NODES,
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_DRAIN_RULES,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
    Resource,
)
from fleet.planner import conditions as C
from fleet.planner.actions import (
    Action,
    AnnotateWorkerVersion,
    ClearSignal,
    CreateNodePlan,
    HaltObject,
    MarkNodePlanFailed,
    PatchMachineSetVersion,
    PatchMachineVersion,
    PauseObject,
    RecordEvent,
    RecordWrittenVersion,
    ReleaseNodePlan,
    ReleasePause,
    RemoveAnnotation,
    ReportNotInPlace,
    ReportOtherDriver,
    ReportVersionConflict,
    RetryNodePlan,
    SetRolloutStatus,
    SignalNode,
    StartNodePlan,
    UncordonNode,
    UpdateNodePlanStatus,
    WriteVersion,
)
from fleet.telemetry import context_from_traceparent, current_traceparent
from fleet.world.clusters import ClusterRegistry
from fleet.world.drainrules import DrainRuleError, rules_for_machine
from fleet.world.executors import executor, request_for
from fleet.world.model import (
    ANN_CAPI_PAUSED,
    ANN_MACHINE_RUNNING_VERSION,
    ANN_PAUSED_FOR,
    ANN_WRITTEN_VERSION,
    KIND_CONTROL_NODE,
    KIND_HOSTED_CP,
    KIND_KCP,
    KIND_MD,
    KIND_NODEPLAN,
    KIND_WORKER_TEMPLATE,
    NODEPLAN_FINALIZER,
    ClusterKey,
    Condition,
    NodePlanInfo,
    ObjectRef,
    format_time,
    nodeplan_from,
)
from fleet.world.records import NodeRecord

log = logging.getLogger(__name__)

OWNER_RESOURCES: dict[str, Resource] = {KIND_MD: MACHINE_DEPLOYMENTS, KIND_KCP: K0S_CONTROL_PLANES,
                                        KIND_NODEPLAN: NODE_PLANS, "Machine": MACHINES,
                                        "MachineSet": MACHINE_SETS,
                                        KIND_WORKER_TEMPLATE: K0S_WORKER_CONFIG_TEMPLATES,
                                        KIND_HOSTED_CP: K0SMOTRON_CONTROL_PLANES}


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class DispatchStats:
    """What the dispatcher did (for tests and benchmarks)."""

    writes: int = 0
    creates: int = 0
    already: int = 0
    declined: int = 0
    errors: int = 0
    by_action: dict[str, int] = field(default_factory=dict)

    def count(self, action: Action) -> None:
        name = type(action).__name__
        self.by_action[name] = self.by_action.get(name, 0) + 1


def _condition_list(existing: list[dict[str, Any]], wanted: tuple[Condition, ...],
                    now: datetime) -> list[dict[str, Any]]:
    """Conditions with ours replaced; lastTransitionTime moves only when status changes."""
    by_type = {c.get("type"): c for c in existing if isinstance(c, dict)}
    out = [c for c in existing if isinstance(c, dict)
           and c.get("type") not in {w.type for w in wanted}]
    for w in wanted:
        old = by_type.get(w.type)
        ltt = old.get("lastTransitionTime") if old and old.get("status") == w.status else None
        out.append({"type": w.type, "status": w.status, "reason": w.reason or w.status,
                    "message": w.message, "lastTransitionTime": ltt or format_time(now)})
    return out


def _failed_conditions(reason: str, message: str) -> tuple[Condition, ...]:
    return (Condition(C.NP_COMPLETED, "False", reason, ""),
            Condition(C.NP_FAILED, "True", reason, message))


class Dispatcher:
    def __init__(self, *, mgmt: KubeClient, view: ManagementView, registry: ClusterRegistry,
                 config: FleetConfig, recorder: EventRecorder, tracer: trace.Tracer,
                 clock: Callable[[], datetime] = _now,
                 artifacts: ArtifactResolver | None = None) -> None:
        self.mgmt = mgmt
        self.view = view
        self.registry = registry
        self.config = config
        self.recorder = recorder
        self.tracer = tracer
        self.clock = clock
        self.artifacts = artifacts or ArtifactResolver(config.download)
        self.stats = DispatchStats()
        self.unsure: set[tuple[str, str]] = set()
        self.background: anyio.abc.TaskGroup | None = None
        self._events = anyio.CapacityLimiter(8)  # Events being recorded in the background

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

    # -- plumbing ------------------------------------------------------------------------
    def _cache_for(self, res: Resource) -> ObjectCache | None:
        return self.view.caches.get(res)

    def _remember(self, res: Resource, obj: KubeObject | None) -> None:
        cache = self._cache_for(res)
        if cache is not None and obj:
            obj.setdefault("kind", res.kind)
            obj.setdefault("apiVersion", res.api_version)
            cache.observe(obj)

    async def _patch(self, client: KubeClient, res: Resource, name: str, namespace: str | None,
                     mutate: Callable[[KubeObject], dict[str, Any] | None], *,
                     subresource: str | None = None,
                     cache: ObjectCache | RecordCache[Any] | None = None
                     ) -> KubeObject | None:
        known = cache if cache is not None else self._cache_for(res)
        # A workload RecordCache gives the kept subset of the object with its
        # resourceVersion: mutate reads only what is kept, and the precondition makes the
        # API server refuse the patch if the object moved on since.
        current = known.object(name, namespace or "") if known is not None else None
        if current is not None and not (current.get("metadata") or {}).get("resourceVersion"):
            current = None  # a provisional copy of ours: read the real thing
        try:
            obj = await patch_with_retry(client, res, name, mutate, namespace,
                                         subresource=subresource, current=current)
        except NotFoundError:
            if current is None:
                raise
            # The cached object was stale (deleted and recreated?): retry from a fresh read.
            obj = await patch_with_retry(client, res, name, mutate, namespace,
                                         subresource=subresource)
        if obj is None:
            self.stats.declined += 1
            return None
        self.stats.writes += 1
        obj.setdefault("kind", res.kind)
        obj.setdefault("apiVersion", res.api_version)
        if cache is not None:
            cache.observe(obj)
        else:
            self._remember(res, obj)
        return obj

    async def perform(self, action: Action) -> None:
        """Perform one action. Raises KubeError for the caller to log and retry later."""
        self.stats.count(action)
        handler = getattr(self, f"_do_{type(action).__name__}")
        await handler(action)

    async def event(self, regarding: Any, reason: str, note: str, *, type: str = NORMAL,
                    action: str = "Upgrade", related: Any = None, key: str = "") -> None:
        """Record an Event; in the background when the controller gave us a task group
        (Events are for humans: they must never delay the next node)."""
        async def emit() -> None:
            await self.recorder.emit(regarding, reason=reason, action=action, note=note,
                                     type=type, related=related, key=key)

        if self.background is not None:
            self.background.start_soon(self._bounded, emit)
        else:
            await emit()

    async def _bounded(self, emit: Callable[[], Awaitable[None]]) -> None:
        # A fresh fleet's start-up records thousands of Events at once: a few at a time,
        # each on a kept-alive connection, not one new connection per Event.
        async with self._events:
            await emit()

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

    def _signal_object(self, cluster: ClusterKey, node_kind: str
                       ) -> tuple[KubeClient, Resource, RecordCache[NodeRecord]] | None:
        """Where a node's signal lives: its workload cluster's client, the resource (Node,
        or ControlNode for a pure controller) and that cluster's cache of it."""
        wc = self.registry.get(cluster)
        if wc is None or wc.client is None:
            return None
        if node_kind == KIND_CONTROL_NODE:
            return wc.client, CONTROL_NODES, wc.control_nodes
        return wc.client, NODES, wc.nodes

    async def _do_SignalNode(self, a: SignalNode) -> None:
        target = self._signal_object(a.cluster, a.node_kind)
        if target is None:
            return
        client, res, cache = target
        ex = executor(a.executor)
        req = a.request
        value = ex.encode(req)

        def mutate(node: KubeObject) -> dict[str, Any] | None:
            ann = (node.get("metadata") or {}).get("annotations") or {}
            cur = ex.read(ann)
            if cur is not None and cur.is_request(req.plan_id, req.created, req.attempt):
                return None  # carries this very request already
            if cur is not None and cur.plan_id != req.plan_id and not cur.terminal and (
                    ex.shared_key or self._plan_alive(cur.plan_id)):
                return None  # another live request: the planner waits for it
            return {"metadata": {"annotations": {ex.version_key: SIGNAL_VERSION,
                                                 ex.data_key: value}}}

        await self._patch(client, res, a.node, None, mutate, cache=cache)

    def _plan_alive(self, plan_id: str) -> bool:
        ns, _, name = plan_id.partition("/")
        obj = self.view[NODE_PLANS].get(name, ns)
        if obj is None:
            return False
        phase = (obj.get("status") or {}).get("phase")
        return phase not in (NodePlanPhase.COMPLETED, NodePlanPhase.FAILED)

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

    # -- nodes -----------------------------------------------------------------------------
    async def _do_ClearSignal(self, a: ClearSignal) -> None:
        target = self._signal_object(a.cluster, a.node_kind)
        if target is None:
            return
        client, res, cache = target
        ex = executor(a.executor)

        def mutate(node: KubeObject) -> dict[str, Any] | None:
            ann = (node.get("metadata") or {}).get("annotations") or {}
            if ex.plan_id_in(ann) != a.plan_id:
                return None
            return {"metadata": {"annotations": dict.fromkeys((ex.data_key, ex.version_key))}}

        try:
            obj = await self._patch(client, res, a.node, None, mutate, cache=cache)
        except NotFoundError:
            return
        if obj is not None:
            log.info("cleared request %s from %s %s", a.plan_id, a.node_kind, a.node)

    async def _do_UncordonNode(self, a: UncordonNode) -> None:
        wc = self.registry.get(a.cluster)
        if wc is None or wc.client is None:
            return

        def mutate(node: KubeObject) -> dict[str, Any] | None:
            ann = (node.get("metadata") or {}).get("annotations") or {}
            if CORDONED_BY_KEY not in ann:
                return None  # not our cordon: never lift someone else's
            try:
                sig = parse_signal(ann)
            except ValueError:
                sig = None
            if sig is not None and (sig.status is None or not sig.status.status.terminal) \
                    and self._plan_alive(sig.planId):
                return None
            return {"spec": {"unschedulable": None},
                    "metadata": {"annotations": {CORDONED_BY_KEY: None}}}

        try:
            obj = await self._patch(wc.client, NODES, a.node, None, mutate, cache=wc.nodes)
        except NotFoundError:
            return
        if obj is not None:
            cluster = self.view[CLUSTERS].get(a.cluster[1], a.cluster[0])
            await self.event(cluster or ObjectRef("Cluster", *a.cluster), "NodeUncordoned",
                             f"uncordoned node {a.node}: its upgrade request was withdrawn",
                             action="Uncordon")

    # -- Machines and owners ------------------------------------------------------------------
    async def _do_PatchMachineVersion(self, a: PatchMachineVersion) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            record = a.record_running and ann.get(ANN_MACHINE_RUNNING_VERSION) != a.version
            if (obj.get("spec") or {}).get("version") == a.version and not record:
                return None
            patch: dict[str, Any] = {"spec": {"version": a.version}}
            if record:
                patch["metadata"] = {"annotations": {ANN_MACHINE_RUNNING_VERSION: a.version}}
            return patch

        await self._patch(self.mgmt, MACHINES, a.machine.name, a.machine.namespace, mutate)

    async def _do_AnnotateWorkerVersion(self, a: AnnotateWorkerVersion) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ann.get(ANN_MACHINE_RUNNING_VERSION) == a.version:
                return None
            return {"metadata": {"annotations": {ANN_MACHINE_RUNNING_VERSION: a.version}}}

        await self._patch(self.mgmt, MACHINES, a.machine.name, a.machine.namespace, mutate)

    async def _do_SetRolloutStatus(self, a: SetRolloutStatus) -> None:
        res = OWNER_RESOURCES[a.owner.kind]
        now = self.clock()
        counts = a.counts.as_status()

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            status = obj.get("status") or {}
            conds = _condition_list(status.get("conditions") or [], a.conditions, now)
            if conds == status.get("conditions") and status.get("k0sFleet") in (None, counts):
                return None  # (None: a CRD that prunes it; never write in a loop)
            return {"status": {"conditions": conds, "k0sFleet": counts}}

        await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate,
                          subresource="status")

    async def _do_RemoveAnnotation(self, a: RemoveAnnotation) -> None:
        res = OWNER_RESOURCES[a.obj.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ann.get(a.key) != a.value:
                return None
            return {"metadata": {"annotations": {a.key: None}}}

        await self._patch(self.mgmt, res, a.obj.name, a.obj.namespace, mutate)

    async def _event_on(self, ref: ObjectRef, reason: str, note: str, *, action: str,
                        type: str = WARNING) -> None:
        """An Event regarding the owner object ``ref`` (its cached copy when there is one)."""
        await self.event(self._owner_obj(ref) or ref, reason, note, type=type, action=action)

    async def _do_HaltObject(self, a: HaltObject) -> None:
        await self._event_on(a.owner, "RolloutHalted", a.message, action="Halt")

    async def _do_ReportNotInPlace(self, a: ReportNotInPlace) -> None:
        await self._event_on(a.owner, a.reason, a.message, action="Plan")

    async def _do_RecordEvent(self, a: RecordEvent) -> None:
        await self._event_on(a.regarding, a.reason, a.note, type=a.type, action=a.action)

    # -- the one writer of versions ----------------------------------------------------------
    async def _do_RecordWrittenVersion(self, a: RecordWrittenVersion) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ann.get(ANN_WRITTEN_VERSION) == a.version:
                return None
            if _object_version(a.owner.kind, obj) != a.version:
                return None  # changed meanwhile: the next pass decides afresh
            return {"metadata": {"annotations": {ANN_WRITTEN_VERSION: a.version}}}

        if await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate):
            obj = self._owner_obj(a.owner)
            await self.event(obj or a.owner, "VersionAdopted",
                             f"k0s-fleet writes this object's version from now on (recorded "
                             f"{a.version}" + (f"; FleetUpgrade {a.intent.name}" if a.intent
                                               else "") + ")", action="Adopt")

    async def _do_WriteVersion(self, a: WriteVersion) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            current = _object_version(a.owner.kind, obj)
            paused_ok = not a.pause or (ANN_CAPI_PAUSED in ann
                                        and ann.get(ANN_PAUSED_FOR) == a.version)
            if current == a.version and ann.get(ANN_WRITTEN_VERSION) == a.version and paused_ok:
                return None  # done already
            if current != a.expected or ann.get(ANN_WRITTEN_VERSION) != a.expected:
                return None  # someone else wrote it meanwhile: never race (reported next pass)
            if a.pause and ANN_CAPI_PAUSED in ann and ANN_PAUSED_FOR not in ann:
                return None  # paused by someone else: not ours to take over
            annotations: dict[str, str | None] = {ANN_WRITTEN_VERSION: a.version}
            if a.pause:
                annotations |= {ANN_CAPI_PAUSED: "", ANN_PAUSED_FOR: a.version}
            return {"metadata": {"annotations": annotations}, "spec": _version_patch(
                a.owner.kind, a.version)}

        obj = await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate)
        if obj is not None:
            await self.event(obj, "VersionWritten",
                             f"k0s-fleet wrote version {a.version} (was {a.expected})"
                             + ("; reconciliation paused (cluster.x-k8s.io/paused) until every "
                                "Machine is on it" if a.pause else "")
                             + (f"; FleetUpgrade {a.intent.name}" if a.intent else ""),
                             action="WriteVersion")

    async def _do_PauseObject(self, a: PauseObject) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ANN_CAPI_PAUSED in ann:
                return None  # paused already (by us, or by someone else: then left alone)
            patch: dict[str, Any] = {"metadata": {"annotations": {ANN_CAPI_PAUSED: "",
                                                                  ANN_PAUSED_FOR: a.version}}}
            if a.template_version and _object_version(a.owner.kind, obj) != a.version:
                patch["spec"] = _version_patch(a.owner.kind, a.version)
            return patch

        await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate)

    async def _do_ReleasePause(self, a: ReleasePause) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ANN_PAUSED_FOR not in ann:
                return None  # not paused by k0s-fleet (or released already)
            if _object_version(a.owner.kind, obj) != a.version:
                return None
            return {"metadata": {"annotations": {ANN_CAPI_PAUSED: None, ANN_PAUSED_FOR: None}}}

        # No Event (one request per object and rollout): VersionWritten said the pause
        # lasts until every Machine is on the version, and K0sFleetUpToDate turning True
        # (and, under a FleetUpgrade, UpgradeCompleted) says that moment.
        await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate)

    async def _do_PatchMachineSetVersion(self, a: PatchMachineSetVersion) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            tspec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
            if tspec.get("version") == a.version:
                return None
            return {"spec": {"template": {"spec": {"version": a.version}}}}

        await self._patch(self.mgmt, MACHINE_SETS, a.machine_set.name, a.machine_set.namespace,
                          mutate)

    async def _do_ReportVersionConflict(self, a: ReportVersionConflict) -> None:
        await self._event_on(a.owner, "VersionChangedByOther", a.message, action="WriteVersion")

    async def _do_ReportOtherDriver(self, a: ReportOtherDriver) -> None:
        await self._event_on(a.owner, a.reason, a.message, action="Hold")

    def _owner_obj(self, ref: ObjectRef) -> KubeObject | None:
        res = OWNER_RESOURCES.get(ref.kind)
        return None if res is None else self.view[res].get(ref.name, ref.namespace)


def _object_version(kind: str, obj: KubeObject) -> str | None:
    spec = obj.get("spec") or {}
    if kind in (KIND_MD, "MachineSet", KIND_WORKER_TEMPLATE):
        return ((spec.get("template") or {}).get("spec") or {}).get("version")
    return spec.get("version")


def _version_patch(kind: str, version: str) -> dict[str, Any]:
    if kind in (KIND_MD, "MachineSet", KIND_WORKER_TEMPLATE):
        return {"template": {"spec": {"version": version}}}
    return {"version": version}


def action_target(action: Action) -> tuple[str, ...]:
    """Actions on the same object run in order; different objects run concurrently."""
    if isinstance(action, CreateNodePlan):
        return ("NodePlan", action.machine.namespace,
                nodeplan_name(action.machine.name, action.version))
    for attr in ("plan", "machine", "machine_set", "owner", "obj", "regarding"):
        ref = getattr(action, attr, None)
        if isinstance(ref, ObjectRef):
            return (ref.kind, ref.namespace, ref.name)
    if isinstance(action, SignalNode | ClearSignal | UncordonNode):
        return ("Node", *action.cluster, action.node)
    return ("other",)


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
