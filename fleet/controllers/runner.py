"""The controller loop: observe -> decide -> act, woken by every change it watches.

Any watch event (management objects, workload Nodes, kubeconfig Secrets) and every write
of its own pokes a :class:`Trigger`; the loop then plans from a fresh snapshot and
performs the actions. A node's completion is therefore followed by the next node's
dispatch within one API round trip or two, not a polling period. Progress deadlines are
honoured by sleeping until the planner's ``wake_at``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import anyio
import anyio.abc
import anyio.lowlevel
from opentelemetry import trace

from fleet.config.models import FleetConfig
from fleet.contract.signal import SignalState
from fleet.controllers.dispatcher import Dispatcher, action_target
from fleet.controllers.heap import HeapTrimmer
from fleet.controllers.infra import InfraMachines
from fleet.controllers.observe import ManagementView, kubeconfig_secrets
from fleet.controllers.parts import FleetParts
from fleet.controllers.takeover import Sharding, ShardTakeover, Takeover
from fleet.events import EventRecorder
from fleet.kube import KubeClient, KubeError
from fleet.kube.backoff import Backoff
from fleet.kube.resources import (
    SECRETS,
)
from fleet.planner import COMPLETING, PENDING, FleetPolicy, PlannerSettings, PlanResult
from fleet.planner.actions import STARTS, Action, CreateNodePlan, urgency
from fleet.planner.incremental import IncrementalPlanner, IncrementalResult, Merger
from fleet.telemetry import get_tracer, link_from_traceparent
from fleet.world.clusters import WORKLOAD_WATCH_TIMEOUT, ClientFactory, ClusterRegistry
from fleet.world.fence import writes_for
from fleet.world.model import ClusterKey, ObjectRef, Snapshot
from fleet.world.snapshot import custom_kubeconfig_secrets, watched_namespaces

log = logging.getLogger(__name__)

PassListener = Callable[[Snapshot, PlanResult], None]



def _now() -> datetime:
    return datetime.now(UTC)


def planner_settings(config: FleetConfig) -> PlannerSettings:
    """The planner's knobs from the fleet YAML."""
    d = config.rollout.progress_deadlines
    deadlines: dict[str, timedelta] = {PENDING: d.pending, COMPLETING: d.verifying}
    for state in SignalState:
        limit = d.for_state(state)
        if limit is not None:
            deadlines[state.value] = limit
    return PlannerSettings(deadlines=deadlines, default_deadline=max(deadlines.values()),
                           halt_at_failures=config.rollout.failure_budget)


class Trigger:
    """Level-triggered wake-up: any number of pokes while busy make one more pass."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self.pokes = 0
        self.first_poke: float | None = None  # monotonic time of the oldest unserved poke
        self.served: float | None = None  # ... of the poke the current pass serves

    def poke(self) -> None:
        self.pokes += 1
        if not self._event.is_set():
            self.first_poke = time.monotonic()
        self._event.set()

    async def wait(self, timeout: float | None) -> bool:
        """Wait for a poke (or the timeout); True when poked.

        Always a checkpoint, even when a poke is waiting already: a loop poked again by
        every pass must still yield to other tasks, and must stop once cancelled. Without
        it a controller stopped from outside (its caller's cancel scope) was seen planning
        on, 76 000 passes after the stop: each pass's action groups were cancelled at once
        and poked it again, and anyio's cancel delivery never caught the loop itself.
        ``checkpoint_if_cancelled`` yields until a pending cancellation is delivered."""
        poked = self._event.is_set()
        if poked:
            await anyio.lowlevel.checkpoint_if_cancelled()
            await anyio.lowlevel.checkpoint()
        else:
            with anyio.move_on_after(math.inf if timeout is None else max(0.0, timeout)):
                await self._event.wait()
                poked = True
        self._event = anyio.Event()
        self.served, self.first_poke = (self.first_poke if poked else None), None
        return poked


@dataclass
class ControllerStats:
    passes: int = 0
    actions: int = 0
    errors: int = 0
    plan_seconds: float = 0.0
    clusters_planned: int = 0  # summed over passes (a pass plans the clusters that moved)
    last_pass: datetime | None = None
    # Seconds from the change that woke a pass to its dispatches being sent (the
    # controller's own share of "one node completes -> the next one starts").
    dispatch_reaction: list[float] = field(default_factory=list)
    by_type: dict[str, int] = field(default_factory=lambda: defaultdict(int))


async def hold_token(stack: contextlib.AsyncExitStack, limiter: anyio.CapacityLimiter
                     ) -> None:
    """Take one of ``limiter``'s tokens for the life of ``stack``: without yielding when one
    is free and nobody waits, else in turn. anyio's ``acquire`` yields to the event loop even
    when a token is free, and each yield let the control loop run a whole planning pass
    (5-35 ms at 1000 clusters) before this group's first request was sent: a NodePlan's
    create waited behind a pass that had nothing to do with it (bench/README.md "Requests
    sent before the next pass")."""
    try:
        limiter.acquire_nowait()
    except anyio.WouldBlock:
        await limiter.acquire()
    stack.callback(limiter.release)


class FleetController:
    """One controller instance (run it only while holding the leader Lease)."""

    def __init__(self, mgmt: KubeClient, config: FleetConfig, *,
                 tracer: trace.Tracer | None = None, recorder: EventRecorder | None = None,
                 clock: Callable[[], datetime] = _now, identity: str = "k0s-fleet",
                 settings: PlannerSettings | None = None, policy: FleetPolicy | None = None,
                 on_pass: PassListener | None = None,
                 client_factory: ClientFactory | None = None, trigger: Trigger | None = None,
                 concurrency: int = 16, cluster_concurrency: int = 4,
                 watch_timeout: int = 120, unreachable_after: float | None = None,
                 wedged_after: float | None = None, settle_bound: float | None = None,
                 sharding: Sharding | None = None,
                 write_fence: Callable[[], bool] | None = None,
                 after_start_up: Callable[[str], None] | None = None) -> None:
        """``unreachable_after`` / ``wedged_after`` (seconds) override the fleet config's
        ``clusters.unreachableAfter`` / ``status.wedgedAfter`` (tests use short ones);
        ``settle_bound``: how long a workload cluster's first answer is waited for before
        it is planned on (default: the unreachable bound + 30 s); ``sharding``: act only on
        the clusters its shard names (several active replicas), with the take-over of
        shards (:class:`~fleet.controllers.takeover.ShardTakeover`, :attr:`takeover`);
        ``write_fence``: every write of
        this controller (management and workload clusters, Events) is sent only while it
        answers True (:meth:`fleet.kube.KubeClient.fenced`; each action's writes are marked
        as its cluster's, :func:`fleet.world.fence.writes_for`); ``after_start_up``: called with
        ``"first pass"`` when the first pass is about to run, and with ``"first quiet"``
        once the work that pass started is done (nothing in flight, no change waiting)."""
        if write_fence is not None:
            mgmt = mgmt.fenced(write_fence)
        self.mgmt = mgmt
        self.config = config
        self.clock = clock
        self.identity = identity
        self.settings = settings or planner_settings(config)
        self.policy = policy
        self.on_pass = on_pass
        self.tracer = tracer or get_tracer("fleet.controller")
        self.trigger = trigger or Trigger()
        # The snapshot per cluster, and which clusters moved since the last pass.
        self.parts = FleetParts(config)
        # A policy that judges other replicas' clusters from their progress alone
        # (fleet.rollout.policy.RolloutPolicy.digest): their parts keep only that.
        self.parts.digest = getattr(policy, "digest", None)
        self.view = ManagementView(mgmt, namespaces=watched_namespaces(config),
                                   extra_secrets=custom_kubeconfig_secrets(config),
                                   on_change=self.trigger.poke, watch_timeout=watch_timeout,
                                   intent_namespace=config.management.namespace,
                                   on_object=self.parts.listener,
                                   holds=sharding.claims if sharding else None)
        self.registry = ClusterRegistry(
            self.view[SECRETS], on_change=self.trigger.poke, on_cluster=self.parts.touch,
            # long workload watches; a silent one is resumed as soon as before (the
            # management watches' timeout + 30 s, at most 150 s)
            watch_timeout=WORKLOAD_WATCH_TIMEOUT, idle_timeout=min(150.0, watch_timeout + 30.0),
            unreachable_after=(config.clusters.unreachable_after.total_seconds()
                               if unreachable_after is None else unreachable_after),
            write_fence=write_fence,
            allow_file_credentials=config.clusters.kubeconfig_secrets.allows_files,
            **({"client_factory": client_factory} if client_factory else {}))
        self.parts.attach(self.view.caches, self.registry)
        self.planner = IncrementalPlanner(self.settings)
        self.merger = Merger()  # the fleet's snapshot from the parts, re-merging what moved
        self.acting_merger = Merger()  # the same of the clusters this replica acts on
        # The first pass waits for every workload cluster's first answer, at most this long.
        self.settle_bound = (settle_bound if settle_bound is not None
                             else self.registry.unreachable_after + 30)
        self._settled = False
        self.after_start_up = after_start_up
        self._quiet_seen = after_start_up is None
        self._mine: set[ClusterKey] = set()  # the fleet's clusters this replica acts on
        self._acting_set: set[ClusterKey] = set()  # ... and has heard from (planned)
        self._wanted_since: dict[ClusterKey, float] = {}  # monotonic, when it became ours
        self._said_unanswered: set[ClusterKey] = set()  # logged as waiting for an answer
        self._stopped = False
        self.recorder = recorder or EventRecorder(
            mgmt, instance=identity, default_namespace=config.management.namespace)
        self.dispatcher = Dispatcher(mgmt=mgmt, view=self.view, registry=self.registry,
                                     config=config, recorder=self.recorder, tracer=self.tracer,
                                     clock=clock)
        self.infra = InfraMachines(mgmt)
        self.limiter = anyio.CapacityLimiter(concurrency)
        # Writes in flight per workload cluster (its Nodes, and its objects in the
        # management cluster): one busy cluster cannot take every slot.
        self.cluster_concurrency = cluster_concurrency
        self._cluster_limiters: dict[ClusterKey, anyio.CapacityLimiter] = {}
        self._target_cluster: dict[tuple[str, ...], ClusterKey] = {}
        self.stats = ControllerStats()
        self.ready = anyio.Event()
        self._retry_at: datetime | None = None
        self._backoff = Backoff(initial=0.2, maximum=10.0)
        self._inflight: set[tuple[str, ...]] = set()
        self._wanted: set[ClusterKey] = set()  # the registry's set, as last asked for
        self._busy: dict[ClusterKey | None, int] = defaultdict(int)
        # Sharded: the take-over of shards (None: a single replica, acting on every
        # cluster; it runs through none of that code).
        self.parts.sharded = sharding is not None and sharding.claims is not None
        self.takeover: ShardTakeover | None = None if sharding is None else ShardTakeover(
            sharding, mgmt=mgmt, config=config, view=self.view, registry=self.registry,
            parts=self.parts, ready=self.ready, busy=self._busy)
        self._cooldown: dict[tuple[str, ...], datetime] = {}
        self._failures: dict[tuple[str, ...], Backoff] = {}
        self._actions_tg: anyio.abc.TaskGroup | None = None
        # Liveness: a pass (or a change waiting for one) older than this means wedged.
        self.wedged_after = (config.status.wedged_after.total_seconds()
                             if wedged_after is None else wedged_after)
        self.watch_timeout = watch_timeout
        self.running = False  # run() entered (this replica leads, or runs alone)
        self._pass_started: float | None = None
        # Free heap pages back to the system after the passes' bursts (start-up, relists).
        self.heap = HeapTrimmer(lambda: self.stats.passes)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Watch, plan and act until cancelled."""
        self.running = True
        try:
            async with anyio.create_task_group() as tg:
                self.dispatcher.background = tg
                self._actions_tg = tg
                await tg.start(self.registry.run)
                await tg.start(self.view.run)
                log.info("%s: management caches synced; controlling", self.identity)
                tg.start_soon(self.heap.run)
                self.ready.set()
                task_status.started()
                await self.loop()
        finally:
            self.running = False

    # -- probes ------------------------------------------------------------------------
    def readiness_problem(self) -> str | None:
        """None when this instance's caches are synced (or it does not run: standby)."""
        if not self.running:
            return None
        if not self.ready.is_set():
            waiting = [f"{r.res}" + (f" ({r.last_error})" if r.last_error else "")
                       for r in self.view.reflectors if not r.synced.is_set()]
            return "management caches not synced yet" + (
                f": {', '.join(waiting)}" if waiting else "")
        return None

    def liveness_problem(self) -> str | None:
        """None unless the control loop is wedged (see fleet.status.health)."""
        if not self.running:
            return None
        now = time.monotonic()
        bound = self.wedged_after
        if self._pass_started is not None and now - self._pass_started > bound:
            return f"a planning pass has been running for {now - self._pass_started:.0f}s"
        first = self.trigger.first_poke
        if self.ready.is_set() and first is not None and now - first > bound:
            return f"changes have waited {now - first:.0f}s for a planning pass"
        # A watch request may legitimately stay silent until its timeout (+ read slack).
        quiet = max(bound, self.watch_timeout + 60)
        for r in self.view.reflectors:
            if now - r.last_activity > quiet:
                return (f"the {r.res} watch has neither progressed nor failed for "
                        f"{now - r.last_activity:.0f}s")
        return None

    async def loop(self) -> None:
        timeout: float | None = 0.0
        while True:
            await self.trigger.wait(timeout)
            self._pass_started = time.monotonic()
            try:
                result = await self.reconcile_once()
            except Exception:
                # One unreadable object or a bug must not stop the fleet's controller.
                self.stats.errors += 1
                delay = self._backoff.next_delay()
                log.exception("planning pass failed; next attempt in %.1fs", delay)
                timeout = delay
                continue
            finally:
                self._pass_started = None
            wake = result.wake_at
            for t in (self._retry_at, *self._cooldown.values()):
                if t is not None and (wake is None or t < wake):
                    wake = t
            timeout = None if wake is None else (wake - self.clock()).total_seconds()
            if not self._quiet_seen and self._settled and self.settled():
                self._quiet_seen = True
                assert self.after_start_up is not None
                self.after_start_up("first quiet")

    def settled(self) -> bool:
        """True when no pass runs, no poke waits to be served and no action is in flight:
        the last pass decided on what the caches hold now (for tests and benchmarks)."""
        return (not self._inflight and self._pass_started is None
                and self.trigger.first_poke is None)

    async def idle(self) -> None:
        """Wait until no action is in flight (for tests and benchmarks)."""
        while self._inflight:
            await anyio.sleep(0.005)

    async def reconcile_once(self) -> IncrementalResult:
        """One observe -> decide -> act pass, over the clusters that moved.

        The snapshot is kept per cluster (:class:`~fleet.controllers.parts.FleetParts`):
        a pass rebuilds the parts of the clusters something happened in, the rollout
        policy recomputes only their progress, and the incremental planner plans them
        (and any cluster whose wake-up time came or whose hold changed); the rest of the
        fleet's plan is what it was. Only the freshly planned clusters' actions are
        performed: the others' were performed (or are in flight) already, and whatever
        ends an action (its completion, its failure's cooldown) dirties its cluster.

        Actions run in the background, one object at a time: a pass never waits for the
        writes of the previous one, so a node's completion is acted on at once even while
        other objects' status is being written. An object with an action in flight (or
        cooling down after a failure) gets no new action until that one is done; what
        an in-flight action will change is already in the caches where it matters for
        the budget (a NodePlan being created is cached before the request is sent).
        """
        t0 = time.perf_counter()
        if not await self.dispatcher.settle_unsure():
            self._retry_at = self.clock() + timedelta(seconds=self._backoff.next_delay())
            return IncrementalResult.empty()
        self._retry_at = None
        now = self.clock()
        for target, until in list(self._cooldown.items()):
            if until <= now:
                del self._cooldown[target]
                if (ckey := self._target_cluster.get(target)) is not None:
                    self.parts.touch(ckey)
        parts = self.parts
        acting = self._acting(now)
        if acting is None:
            return IncrementalResult.empty()
        dirty = parts.take_dirty()
        if dirty and log.isEnabledFor(logging.DEBUG):
            log.debug("pass %d starts: %s", self.stats.passes + 1,
                      ", ".join(f"{ns}/{n}" for ns, n in sorted(dirty)[:5])
                      + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else ""))
        infra = await self.infra.for_machines(parts.needing_infra(sorted(dirty & acting)))
        parts.rebuild(sorted(dirty), now, infra)
        # The fleet rollout looks at every cluster; with several replicas those another one
        # acts on (or this one has not heard from yet) are judged from the management
        # objects only (Snapshot.foreign), and only this replica's are planned.
        # The FleetUpgrades as they are now: a part keeps those of when it was built (a
        # status write rebuilds no part), the fleet-wide status writer needs the latest.
        fleet = dataclasses.replace(self.merger.merge(parts.parts, now), upgrades=parts.upgrades)
        planned = parts.parts if acting.issuperset(parts.parts) else {
            k: v for k, v in parts.parts.items() if k in acting}
        snapshot = fleet if planned is parts.parts else dataclasses.replace(
            self.acting_merger.merge(planned, now), upgrades=parts.upgrades)
        hold = await self.policy(fleet) if self.policy is not None else None
        stopped = self.config.rollout.emergency_stop or (
            self.policy is not None and self.policy.stopped)
        if stopped != self._stopped:
            self._stopped = stopped
            self.planner.forget()  # what the stop held back is decided (and done) again
        inc = self.planner.plan(planned, now, hold=hold)
        if len(self._target_cluster) > 10_000:  # only in-flight or cooling targets are asked
            self._target_cluster = {t: c for t, c in self._target_cluster.items()
                                    if t in self._inflight or t in self._cooldown}
        actions: list[Action] = []
        for ckey, fresh in inc.fresh_by_cluster.items():
            for a in fresh.actions:
                self._target_cluster[action_target(a)] = ckey
            actions += fresh.actions
        # Emergency stop (fleet YAML, or the rollout policy's annotation): start nothing,
        # signal nothing; what nodes already run finishes and is still looked after.
        if stopped:
            actions = [a for a in actions if not isinstance(a, STARTS)]
        actions = [a for a in actions if action_target(a) not in self._inflight
                   and action_target(a) not in self._cooldown]
        self.stats.passes += 1
        self.stats.clusters_planned += len(inc.replanned)
        self.stats.plan_seconds += time.perf_counter() - t0
        self.stats.last_pass = snapshot.now
        if actions:
            await self._act(snapshot, inc.fresh, actions)
        log.debug("pass %d: %d clusters rebuilt, %d planned, %d actions, %.1f ms",
                  self.stats.passes, len(dirty), len(inc.replanned), len(actions),
                  (time.perf_counter() - t0) * 1000)
        if self.policy is not None:
            self.policy.on_pass(snapshot)
        if self.on_pass is not None:
            self.on_pass(snapshot, inc.result)  # the fleet's whole plan: put together now
        return inc

    def _acting(self, now: datetime) -> set[ClusterKey] | None:
        """The clusters this pass plans (None: no pass yet, first answers awaited).

        Those of the fleet this replica acts on (all of them without sharding), each once
        its workload cluster has answered: before the first pass every one of them
        (:meth:`_settle`), later one that became this replica's (a shard taken over) on
        its own, while the others are planned. Until then it is judged like another
        replica's cluster (from the management objects), never from an empty cache.
        """
        parts = self.parts
        changed = parts.membership_changed
        members = parts.refresh_members()
        takeover: Takeover | None = self.takeover
        if takeover is None:
            mine = wanted = set(members)
        else:
            mine = {k for k in members if takeover.acts_on(k)}
            early = takeover.keep(mine)
            wanted = mine | early if early else mine
        if changed or mine != self._mine or wanted != self._wanted:
            self._wanted = wanted
            self.registry.want(kubeconfig_secrets(self.config, sorted(wanted)))
            t = time.monotonic()
            self._wanted_since = {k: self._wanted_since.get(k, t) for k in mine}
            self._mine = mine
        if not self._settled and not self._settle(now):
            return None
        t = time.monotonic()
        # (the bound first: past the first pass it holds for every cluster but one just
        # taken over; asking the registry about each of 1000 clusters on every pass was
        # an eighth of the passes' CPU during a start-up, py-spy: bench/README.md)
        acting = {k for k in mine if t - self._wanted_since[k] >= self.settle_bound
                  or self.registry.settled(k)}
        if acting != mine:
            self._retry_at = now + timedelta(seconds=1)
            self._say_unanswered(mine - acting, t)
        if acting - self._acting_set:
            self._say_answered(acting - self._acting_set, t)
        if acting != self._acting_set or changed:
            for k in acting ^ self._acting_set:
                parts.touch(k)
            parts.foreign = frozenset(members) - acting
            self._acting_set = acting
        return acting

    def _say_answered(self, new: set[ClusterKey], t: float) -> None:
        """Log the clusters taken over (past the first pass) that are planned from now."""
        waited = sorted(t - self._wanted_since[k] for k in new
                        if self._wanted_since[k] > -math.inf)
        if waited:
            log.info("acting on %d more clusters (%s), %.1f-%.1fs after they became this "
                     "replica's", len(waited), ", ".join(f"{ns}/{n}" for ns, n in
                                                         sorted(new)[:5]),
                     waited[0], waited[-1])
        for k in new:
            self._said_unanswered.discard(k)

    def _say_unanswered(self, waiting: set[ClusterKey], t: float) -> None:
        """Log once per cluster what a taken-over cluster still waits for, 10 s on."""
        for k in sorted(waiting):
            if k in self._said_unanswered or t - self._wanted_since[k] < 10:
                continue
            self._said_unanswered.add(k)
            log.info("workload cluster %s/%s: no answer %.0fs after it became this "
                     "replica's (%s); planned anyway %.0fs after", k[0], k[1],
                     t - self._wanted_since[k], self.registry.waiting_for(k),
                     self.settle_bound)

    def _settle(self, now: datetime) -> bool:
        """Before the first pass: wait until every workload cluster of this replica has
        given an answer (listed, unusable kubeconfig, or unreachable for the registry's
        bound), so that a restarted controller writes no status from caches that are not
        there yet (it would write them back a moment later). Bounded: past
        ``settle_bound`` seconds it plans anyway, and says which clusters it could not hear
        from."""
        waiting = sorted(k for k in self._mine if not self.registry.settled(k))
        # Bounded from when those clusters were asked for (the first pass, once the
        # management caches synced), not from the start: a slow management list under
        # load used up the whole bound before one workload cluster was asked.
        started = min((self._wanted_since[k] for k in waiting), default=time.monotonic())
        if waiting and time.monotonic() - started < self.settle_bound:
            self._retry_at = now + timedelta(seconds=1)
            return False
        if waiting:
            log.warning("planning although %d workload clusters have not answered within "
                        "%.0fs: %s", len(waiting), self.settle_bound,
                        ", ".join(f"{ns}/{name}" for ns, name in waiting[:10]))
        else:
            log.info("every workload cluster answered; planning")
        self._settled = True
        if self.after_start_up is not None:
            self.after_start_up("first pass")
        # Past the first pass: what was waited for (or given up on) is planned from now on.
        self._wanted_since = dict.fromkeys(self._mine, -math.inf)
        self.parts.touch_all()
        return True

    async def _act(self, snapshot: Snapshot, result: PlanResult, actions: list[Action]) -> None:
        links: list[trace.Link] = []
        for a in actions:
            ref = getattr(a, "plan", None)
            p = snapshot.nodeplans.get((ref.namespace, ref.name)) if isinstance(
                ref, ObjectRef) else None
            if p is not None and p.traceparent and len(links) < 32:
                link = link_from_traceparent(p.traceparent)
                if link is not None:
                    links.append(link)
        groups: dict[tuple[str, ...], list[Action]] = defaultdict(list)
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
                self._inflight.add(target)
                cluster = self._target_cluster.get(target)
                self._busy[cluster] += 1
                if self._actions_tg is not None:
                    self._actions_tg.start_soon(self._run_group, target, group, cluster)
                else:
                    await self._run_group(target, group, cluster)

    def _cluster_limiter(self, cluster: ClusterKey | None) -> anyio.CapacityLimiter | None:
        if cluster is None:
            return None
        limiter = self._cluster_limiters.get(cluster)
        if limiter is None:
            if len(self._cluster_limiters) > 4 * len(self.parts.parts) + 64:
                self._cluster_limiters = {k: v for k, v in self._cluster_limiters.items()
                                          if v.borrowed_tokens}
            limiter = self._cluster_limiters[cluster] = anyio.CapacityLimiter(
                self.cluster_concurrency)
        return limiter

    async def _run_group(self, target: tuple[str, ...], group: list[Action],
                         cluster: ClusterKey | None = None) -> None:
        per_cluster = self._cluster_limiter(cluster)
        cancelled = False
        try:
            async with contextlib.AsyncExitStack() as stack:
                if per_cluster is not None:
                    await hold_token(stack, per_cluster)
                await hold_token(stack, self.limiter)
                # Every write below (and the Events it emits in the background) is this
                # cluster's: a sharded replica's fence lets it through only while the
                # cluster's shard is held.
                stack.enter_context(writes_for(cluster))
                for a in group:
                    if self.takeover is not None and cluster is not None and \
                            not self.takeover.acts_on(cluster):
                        return  # its shard is being given back (or lost): stop here
                    try:
                        log.debug("performing %s on %s", type(a).__name__, "/".join(target))
                        await self.dispatcher.perform(a)
                    except Exception as e:  # KubeError, or a bug: never kill the loop
                        if not isinstance(e, KubeError):
                            log.exception("%s on %s", type(a).__name__, "/".join(target))
                        self.stats.errors += 1
                        backoff = self._failures.setdefault(
                            target, Backoff(initial=0.2, maximum=10.0))
                        delay = backoff.next_delay()
                        self._cooldown[target] = self.clock() + timedelta(seconds=delay)
                        log.warning("%s on %s failed (retry in %.1fs): %s",
                                    type(a).__name__, "/".join(target), delay, e)
                        return  # later actions of this object depend on this one
                self._failures.pop(target, None)
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise
        finally:
            self._inflight.discard(target)
            self._busy[cluster] -= 1
            if self._busy[cluster] <= 0:
                del self._busy[cluster]
            # Its cluster is planned again (what the action changed, or what it could
            # not do, decides the next step there); not when the controller is being
            # stopped: a pass for that would start actions only to cancel them.
            if not cancelled:
                if cluster is not None:
                    self.parts.touch(cluster)
                else:
                    self.parts.touch_all()
                self.trigger.poke()
