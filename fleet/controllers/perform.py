"""Performing a pass's actions: grouped by the object they act on, most urgent first,
each group in the background within the limits (fleet.controllers.limits), one group per
object at a time; what is in flight is kept here, and whatever ends a group (done,
failed, stopped) has its cluster planned again."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping

import anyio
import anyio.abc
from opentelemetry import trace

from fleet.controllers.dispatcher import Dispatcher, action_target
from fleet.controllers.limits import ActionLimits, Target, hold_token
from fleet.controllers.parts import FleetParts
from fleet.controllers.stats import ControllerStats
from fleet.controllers.trigger import Trigger
from fleet.kube import KubeError
from fleet.planner import PlanResult
from fleet.planner.actions import Action, CreateNodePlan, urgency
from fleet.telemetry import link_from_traceparent
from fleet.world.fence import writes_for
from fleet.world.model import ClusterKey, ObjectRef, Snapshot

# The loop's logger: ``fleet.controllers.runner=DEBUG`` shows each action performed
# among the passes, as before the move (bench/pass_interleave.py reads both).
log = logging.getLogger("fleet.controllers.runner")


class Performer:
    """The actions in flight, and how they are started (see the module docstring)."""

    def __init__(self, *, dispatcher: Dispatcher, limits: ActionLimits, parts: FleetParts,
                 trigger: Trigger, stats: ControllerStats, tracer: trace.Tracer,
                 acts_on: Callable[[ClusterKey], bool] | None = None) -> None:
        """``acts_on``: sharded, whether this replica still acts on a cluster (a group
        stops once its shard is being given back); None: a single replica."""
        self.dispatcher = dispatcher
        self.limits = limits
        self.parts = parts
        self.trigger = trigger
        self.stats = stats
        self.tracer = tracer
        self.acts_on = acts_on
        self.inflight: set[Target] = set()
        # Groups in flight (or queued) per cluster (None: not known).
        self.busy: dict[ClusterKey | None, int] = defaultdict(int)
        self.target_cluster: dict[Target, ClusterKey] = {}
        self.background: anyio.abc.TaskGroup | None = None  # None: each group awaited

    def fresh(self, fresh_by_cluster: Mapping[ClusterKey, PlanResult]) -> list[Action]:
        """The actions a pass planned afresh, each target's cluster noted."""
        if len(self.target_cluster) > 10_000:  # only in-flight or cooling targets are asked
            self.target_cluster = {t: c for t, c in self.target_cluster.items()
                                   if t in self.inflight or t in self.limits.cooldown}
        actions: list[Action] = []
        for ckey, fresh in fresh_by_cluster.items():
            for a in fresh.actions:
                self.target_cluster[action_target(a)] = ckey
            actions += fresh.actions
        return actions

    def startable(self, actions: list[Action]) -> list[Action]:
        """Those of ``actions`` whose object has none in flight nor cools down."""
        return [a for a in actions if action_target(a) not in self.inflight
                and action_target(a) not in self.limits.cooldown]

    async def act(self, snapshot: Snapshot, result: PlanResult, actions: list[Action]) -> None:
        """Start ``actions`` (of the pass that planned ``result``), grouped by object, most
        urgent first, under one "reconcile" span linked to their NodePlans' traces."""
        links: list[trace.Link] = []
        for a in actions:
            ref = getattr(a, "plan", None)
            p = snapshot.nodeplans.get((ref.namespace, ref.name)) if isinstance(
                ref, ObjectRef) else None
            if p is not None and p.traceparent and len(links) < 32:
                link = link_from_traceparent(p.traceparent)
                if link is not None:
                    links.append(link)
        groups: dict[Target, list[Action]] = defaultdict(list)
        for a in actions:
            groups[action_target(a)].append(a)
        with self.tracer.start_as_current_span(
                "reconcile", links=links,
                attributes={"k0s_fleet.actions": len(actions),
                            "k0s_fleet.objects": len(groups),
                            "k0s_fleet.dispatched": sum(isinstance(a, CreateNodePlan)
                                                        for a in actions)}) as span:
            for d in result.decisions:
                if d.dispatched or d.waiting:
                    span.add_event("decision", {
                        "owner": str(d.owner), "target": d.target,
                        "updated": d.updated, "total": d.total,
                        "unavailable": d.unavailable, "max_unavailable": d.max_unavailable,
                        "dispatched": list(d.dispatched), "waiting": d.waiting})
            for a in actions:
                self.stats.actions += 1
                self.stats.by_type[type(a).__name__] += 1
            woke = self.trigger.served
            if woke is not None and any(isinstance(a, CreateNodePlan) for a in actions) and \
                    len(self.stats.dispatch_reaction) < 10_000:
                self.stats.dispatch_reaction.append(time.monotonic() - woke)
            # A node's request first, what only reports last (the limiters serve their
            # waiters in order): at a control-plane -> worker step the next node's
            # NodePlan was sent after two status writes of the same pass.
            for target, group in sorted(groups.items(), key=lambda g: urgency(g[1])):
                self.inflight.add(target)
                cluster = self.target_cluster.get(target)
                self.busy[cluster] += 1
                if self.background is not None:
                    self.background.start_soon(self._run_group, target, group, cluster)
                else:
                    await self._run_group(target, group, cluster)

    async def _run_group(self, target: Target, group: list[Action],
                         cluster: ClusterKey | None = None) -> None:
        per_cluster = self.limits.cluster_limiter(cluster, len(self.parts.parts))
        cancelled = False
        try:
            async with contextlib.AsyncExitStack() as stack:
                if per_cluster is not None:
                    await hold_token(stack, per_cluster)
                await hold_token(stack, self.limits.limiter)
                # Every write below (and the Events it emits in the background) is this
                # cluster's: a sharded replica's fence lets it through only while the
                # cluster's shard is held.
                stack.enter_context(writes_for(cluster))
                for a in group:
                    if self.acts_on is not None and cluster is not None and \
                            not self.acts_on(cluster):
                        return  # its shard is being given back (or lost): stop here
                    try:
                        log.debug("performing %s on %s", type(a).__name__, "/".join(target))
                        await self.dispatcher.perform(a)
                    except Exception as e:  # KubeError, or a bug: never kill the loop
                        if not isinstance(e, KubeError):
                            log.exception("%s on %s", type(a).__name__, "/".join(target))
                        self.stats.errors += 1
                        delay = self.limits.failed(target)
                        log.warning("%s on %s failed (retry in %.1fs): %s",
                                    type(a).__name__, "/".join(target), delay, e)
                        return  # later actions of this object depend on this one
                self.limits.succeeded(target)
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise
        finally:
            self.inflight.discard(target)
            self.busy[cluster] -= 1
            if self.busy[cluster] <= 0:
                del self.busy[cluster]
            # Its cluster is planned again (what the action changed, or what it could
            # not do, decides the next step there); not when the controller is being
            # stopped: a pass for that would start actions only to cancel them.
            if not cancelled:
                if cluster is not None:
                    self.parts.touch(cluster)
                else:
                    self.parts.touch_all()
                self.trigger.poke()
