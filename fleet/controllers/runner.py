"""The controller loop: observe -> decide -> act, woken by every change it watches.

Any watch event (management objects, workload Nodes, kubeconfig Secrets) and every write
of its own pokes a :class:`~fleet.controllers.trigger.Trigger`; the loop then plans from a
fresh snapshot and performs the actions. A node's completion is therefore followed by the
next node's dispatch within one API round trip or two, not a polling period. Progress
deadlines are honoured by sleeping until the planner's ``wake_at``.

One pass (:meth:`FleetController.reconcile_once`) reads top to bottom. Observe: the
clusters it plans (:meth:`FleetController._acting`: the fleet's, or with sharding those
of this replica's shards, fleet.controllers.takeover; each once its workload cluster
answered, fleet.controllers.settling) and the parts of those that moved. Decide: the
rollout policy's holds and the incremental planner. Act: the fresh actions, in the
background (fleet.controllers.perform) within the limits (fleet.controllers.limits).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import anyio
import anyio.abc
from opentelemetry import trace

from fleet.config.models import FleetConfig
from fleet.contract.signal import SignalState
from fleet.controllers.dispatcher import Dispatcher
from fleet.controllers.heap import HeapTrimmer
from fleet.controllers.infra import InfraMachines
from fleet.controllers.limits import ActionLimits
from fleet.controllers.observe import ManagementView, kubeconfig_secrets
from fleet.controllers.parts import FleetParts
from fleet.controllers.perform import Performer
from fleet.controllers.settling import Settling
from fleet.controllers.stats import ControllerStats
from fleet.controllers.takeover import Sharding, ShardTakeover, Takeover
from fleet.controllers.trigger import Trigger
from fleet.events import EventRecorder
from fleet.kube import KubeClient
from fleet.kube.backoff import Backoff
from fleet.kube.resources import SECRETS
from fleet.planner import COMPLETING, PENDING, FleetPolicy, PlannerSettings, PlanResult
from fleet.planner.actions import STARTS
from fleet.planner.incremental import IncrementalPlanner, IncrementalResult, Merger
from fleet.telemetry import get_tracer
from fleet.world.clusters import WORKLOAD_WATCH_TIMEOUT, ClientFactory, ClusterRegistry
from fleet.world.model import ClusterKey, Snapshot
from fleet.world.snapshot import custom_kubeconfig_secrets, watched_namespaces

log = logging.getLogger(__name__)

PassListener = Callable[[Snapshot, PlanResult], None]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Tuning:
    """The controller's numbers that the fleet YAML does not give, or overrides (tests use
    short ones): ``concurrency`` actions at once, ``cluster_concurrency`` of them per
    workload cluster; ``watch_timeout`` of the management watches (seconds);
    ``unreachable_after`` / ``wedged_after`` (seconds) override the fleet config's
    ``clusters.unreachableAfter`` / ``status.wedgedAfter``; ``settle_bound``: how long a
    workload cluster's first answer is waited for before it is planned on (default: the
    unreachable bound + 30 s); ``planner``: the planner's settings (default: from the
    fleet config, :func:`planner_settings`)."""

    concurrency: int = 16
    cluster_concurrency: int = 4
    watch_timeout: int = 120
    unreachable_after: float | None = None
    wedged_after: float | None = None
    settle_bound: float | None = None
    planner: PlannerSettings | None = None


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


class FleetController:
    """One controller instance (run it only while holding the leader Lease)."""

    def __init__(self, mgmt: KubeClient, config: FleetConfig, *,
                 identity: str = "k0s-fleet", policy: FleetPolicy | None = None,
                 recorder: EventRecorder | None = None, tracer: trace.Tracer | None = None,
                 trigger: Trigger | None = None, clock: Callable[[], datetime] = _now,
                 client_factory: ClientFactory | None = None,
                 on_pass: PassListener | None = None,
                 after_start_up: Callable[[str], None] | None = None,
                 sharding: Sharding | None = None,
                 write_fence: Callable[[], bool] | None = None,
                 tuning: Tuning = Tuning()) -> None:
        """``policy``: the rollout policy each pass asks (holds, emergency stop);
        ``on_pass``: called with each pass's snapshot and the fleet's whole plan;
        ``after_start_up``: called with ``"first pass"`` when the first pass is about to
        run, and with ``"first quiet"`` once the work that pass started is done (nothing in
        flight, no change waiting); ``sharding``: act only on the clusters its shard names
        (several active replicas), with the take-over of shards (:attr:`takeover`, a
        :class:`~fleet.controllers.takeover.ShardTakeover`; None without sharding);
        ``write_fence``: every write of this controller (management and workload
        clusters, Events) is sent only while it answers True
        (:meth:`fleet.kube.KubeClient.fenced`; each action's writes are marked as its
        cluster's, :func:`fleet.world.fence.writes_for`); ``tuning``: :class:`Tuning`."""
        watch_timeout = tuning.watch_timeout
        if write_fence is not None:
            mgmt = mgmt.fenced(write_fence)
        self.mgmt = mgmt
        self.config = config
        self.clock = clock
        self.identity = identity
        self.settings = tuning.planner or planner_settings(config)
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
                               if tuning.unreachable_after is None
                               else tuning.unreachable_after),
            write_fence=write_fence,
            allow_file_credentials=config.clusters.kubeconfig_secrets.allows_files,
            **({"client_factory": client_factory} if client_factory else {}))
        self.parts.attach(self.view.caches, self.registry)
        self.planner = IncrementalPlanner(self.settings)
        self.merger = Merger()  # the fleet's snapshot from the parts, re-merging what moved
        self.acting_merger = Merger()  # the same of the clusters this replica acts on
        # The first pass waits for every workload cluster's first answer, at most this long.
        self.settling = Settling(self.registry, self.parts, bound=(
            tuning.settle_bound if tuning.settle_bound is not None
            else self.registry.unreachable_after + 30), after_start_up=after_start_up)
        self._stopped = False
        self.recorder = recorder or EventRecorder(
            mgmt, instance=identity, default_namespace=config.management.namespace)
        self.dispatcher = Dispatcher(mgmt=mgmt, view=self.view, registry=self.registry,
                                     config=config, recorder=self.recorder, tracer=self.tracer,
                                     clock=clock)
        self.infra = InfraMachines(mgmt)
        self.stats = ControllerStats()
        self.ready = anyio.Event()
        self._retry_at: datetime | None = None
        self._backoff = Backoff(initial=0.2, maximum=10.0)
        self._wanted: set[ClusterKey] = set()  # the registry's set, as last asked for
        self.limits = ActionLimits(concurrency=tuning.concurrency,
                                   cluster_concurrency=tuning.cluster_concurrency, clock=clock)
        self.performer = Performer(
            dispatcher=self.dispatcher, limits=self.limits, parts=self.parts,
            trigger=self.trigger, stats=self.stats, tracer=self.tracer,
            acts_on=sharding.shard.acts_on if sharding is not None else None)
        # Sharded: the take-over of shards (None: a single replica, acting on every
        # cluster; it runs through none of that code).
        self.parts.sharded = sharding is not None and sharding.claims is not None
        self.takeover: ShardTakeover | None = None if sharding is None else ShardTakeover(
            sharding, mgmt=mgmt, config=config, view=self.view, registry=self.registry,
            parts=self.parts, ready=self.ready, busy=self.performer.busy)
        # Liveness: a pass (or a change waiting for one) older than this means wedged.
        self.wedged_after = (config.status.wedged_after.total_seconds()
                             if tuning.wedged_after is None else tuning.wedged_after)
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
                self.performer.background = tg
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
            for t in (self._retry_at, *self.limits.cooldown.values()):
                if t is not None and (wake is None or t < wake):
                    wake = t
            timeout = None if wake is None else (wake - self.clock()).total_seconds()
            self.settling.after_pass(self.settled)

    def settled(self) -> bool:
        """True when no pass runs, no poke waits to be served and no action is in flight:
        the last pass decided on what the caches hold now (for tests and benchmarks)."""
        return (not self.performer.inflight and self._pass_started is None
                and self.trigger.first_poke is None)

    async def idle(self) -> None:
        """Wait until no action is in flight (for tests and benchmarks)."""
        while self.performer.inflight:
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
        for target in self.limits.cooled(now):
            if (ckey := self.performer.target_cluster.get(target)) is not None:
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
        fleet = dataclasses.replace(self.merger.merge(parts.parts, now, moved=parts.take_moved()),
                                    upgrades=parts.upgrades)
        # (the merged parts: the same as parts.parts, with what moved since the last merge
        # for the planner: fleet.world.delta)
        whole = fleet.parts if fleet.parts is not None else parts.parts
        planned = whole if acting.issuperset(parts.parts) else {
            k: v for k, v in parts.parts.items() if k in acting}
        snapshot = fleet if planned is whole else dataclasses.replace(
            self.acting_merger.merge(planned, now), upgrades=parts.upgrades)
        hold = await self.policy(fleet) if self.policy is not None else None
        stopped = self.config.rollout.emergency_stop or (
            self.policy is not None and self.policy.stopped)
        if stopped != self._stopped:
            self._stopped = stopped
            self.planner.forget()  # what the stop held back is decided (and done) again
        inc = self.planner.plan(planned, now, hold=hold)
        actions = self.performer.fresh(inc.fresh_by_cluster)
        # Emergency stop (fleet YAML, or the rollout policy's annotation): start nothing,
        # signal nothing; what nodes already run finishes and is still looked after.
        if stopped:
            actions = [a for a in actions if not isinstance(a, STARTS)]
        actions = self.performer.startable(actions)
        self.stats.passes += 1
        self.stats.clusters_planned += len(inc.replanned)
        self.stats.plan_seconds += time.perf_counter() - t0
        self.stats.last_pass = snapshot.now
        if actions:
            await self.performer.act(snapshot, inc.fresh, actions)
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
        its workload cluster has answered (:class:`~fleet.controllers.settling.Settling`):
        before the first pass every one of them, later one that became this replica's (a
        shard taken over) on its own, while the others are planned. Until then it is
        judged like another replica's cluster (from the management objects), never from
        an empty cache.
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
        settling = self.settling
        if changed or mine != settling.mine or wanted != self._wanted:
            self._wanted = wanted
            self.registry.want(kubeconfig_secrets(self.config, sorted(wanted)))
            settling.asked_for(mine)
        if not settling.settled and not settling.first_pass():
            self._retry_at = now + timedelta(seconds=1)
            return None
        acting = settling.answered(mine)
        if acting != mine:
            self._retry_at = now + timedelta(seconds=1)
        if acting != settling.planned or changed:
            for k in acting ^ settling.planned:
                parts.touch(k)
            parts.foreign = frozenset(members) - acting
            settling.planned = acting
        return acting
