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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

import anyio
import anyio.abc
import anyio.lowlevel
from opentelemetry import trace

from fleet.config.models import FleetConfig
from fleet.contract import nodeplan
from fleet.contract.signal import SignalState
from fleet.controllers.dispatcher import Dispatcher, action_target
from fleet.controllers.handoff import BulkReread, ListAt
from fleet.controllers.heap import HeapTrimmer
from fleet.controllers.infra import InfraMachines
from fleet.controllers.observe import SECRET_FIELD_SELECTOR, ManagementView, kubeconfig_secrets
from fleet.controllers.parts import FleetParts
from fleet.events import EventRecorder
from fleet.kube import GoneError, KubeClient, KubeError
from fleet.kube.backoff import Backoff
from fleet.kube.resources import (
    CLUSTERS,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    SECRETS,
    Resource,
)
from fleet.planner import COMPLETING, PENDING, FleetPolicy, PlannerSettings, PlanResult
from fleet.planner.actions import STARTS, Action, CreateNodePlan, urgency
from fleet.planner.incremental import IncrementalPlanner, IncrementalResult, Merger
from fleet.telemetry import get_tracer, link_from_traceparent
from fleet.world.clusters import WORKLOAD_WATCH_TIMEOUT, ClientFactory, ClusterRegistry
from fleet.world.fence import writes_for
from fleet.world.kept import CAPI_CLUSTER_LABEL
from fleet.world.model import ClusterKey, ObjectRef, Snapshot
from fleet.world.snapshot import custom_kubeconfig_secrets, watched_namespaces

log = logging.getLogger(__name__)

PassListener = Callable[[Snapshot, PlanResult], None]



def _now() -> datetime:
    return datetime.now(UTC)


class Shard(Protocol):
    """Which clusters this replica acts on (fleet.controllers.shard.ShardMembership)."""

    def acts_on(self, cluster: ClusterKey) -> bool: ...


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


async def all_or_first_error(calls: Sequence[Callable[[], Awaitable[None]]],
                             limit: int) -> None:
    """Run ``calls``, ``limit`` at a time. Once one raises a KubeError no more are
    started, and that error is raised when the ones running have ended (not an
    exception group: callers handle a KubeError as from one call)."""
    slots = anyio.CapacityLimiter(limit)
    failed: list[KubeError] = []

    async def run(call: Callable[[], Awaitable[None]]) -> None:
        async with slots:
            if failed:
                return
            try:
                await call()
            except KubeError as e:
                failed.append(e)

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(run, call)
    if failed:
        raise failed[0]


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
                 shard: Shard | None = None,
                 claims: Callable[[ClusterKey], bool] | None = None,
                 kept_since: Callable[[ClusterKey], int] | None = None,
                 write_fence: Callable[[], bool] | None = None,
                 after_start_up: Callable[[str], None] | None = None) -> None:
        """``unreachable_after`` / ``wedged_after`` (seconds) override the fleet config's
        ``clusters.unreachableAfter`` / ``status.wedgedAfter`` (tests use short ones);
        ``settle_bound``: how long a workload cluster's first answer is waited for before
        it is planned on (default: the unreachable bound + 30 s); ``shard``: act only on
        the clusters it names (several active replicas); ``claims``: whether this replica
        keeps a cluster's objects in full (sharded: it holds, or may soon take, the claim
        on its shard; of the other clusters less is kept, re-read by :meth:`warm_taken`
        before acting on them); ``kept_since``: a number that changes whenever a
        cluster begins to be kept in full (what :meth:`read_ahead` read stays complete
        while it does not); ``write_fence``: every write of
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
                                   on_object=self.parts.listener, holds=claims)
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
        # Sharded: the clusters this replica acts on, and its actions in flight per cluster
        # (None: not known) so a shard is given back only once they are done.
        self.shard = shard
        self.claims = claims
        self.parts.sharded = claims is not None
        # Sharded: clusters whose objects are kept in full (re-read when their shard was
        # taken, or acted on since), projected down again once their shard is given back.
        self._full: set[ClusterKey] = set()
        self._warmed: set[ClusterKey] = set()  # re-read for the shards warming now
        # Clusters of shards being taken whose workload client was started as soon as
        # their kubeconfig Secret was read in full (before they are acted on).
        self._connected_early: set[ClusterKey] = set()
        self.kept_since = kept_since
        # Read ahead (Machines and Secrets in full), with kept_since as of that read.
        self._read_ahead: dict[ClusterKey, int] = {}
        self._wanted: set[ClusterKey] = set()  # the registry's set, as last asked for
        # More clusters than this to re-read at once: one list of everything instead,
        # its progress kept when a call is cut off.
        self.reread_bulk = 64
        self.reread_concurrency = 8  # lists at once while re-reading (below reread_bulk)
        self.plans_per_list = 50  # taken clusters whose NodePlans one list reads
        self._bulk = BulkReread()
        self.reread_page_size = 500
        self.bulk_pages_read = 0
        self._busy: dict[ClusterKey | None, int] = defaultdict(int)
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

    def busy_clusters(self) -> set[ClusterKey]:
        """Clusters with an action in flight (or queued); every cluster of the fleet when
        an action's cluster could not be told."""
        busy = {k for k, n in self._busy.items() if n > 0}
        if None in busy:
            return set(self.parts.members) | {k for k in busy if k is not None}
        return {k for k in busy if k is not None}

    async def warm_taken(self, taken: Callable[[ClusterKey], bool]) -> bool:
        """True once newly taken shards may be acted on (``taken``: whether a cluster is in
        one): their clusters' NodePlans have been read into the NodePlan cache (what the
        previous holder dispatched counts, whether or not the watch has delivered it
        yet), and with claims, the objects that were kept foreign (fleet/world/kept.py) have
        been read again in full. That is one NodePlan list per ``plans_per_list`` clusters and
        per cluster one Machine and one Secret list (none for a cluster read ahead and
        kept in full since: :meth:`read_ahead`), by Cluster API's cluster-name label; past
        ``reread_bulk`` clusters, one paged list of every one of them. Re-reads that are
        done stay done when the call is cut off (the claims task bounds it) or fails.

        The cache is filled from a read rather than waited on: before, a taken shard
        waited until the NodePlan watch had delivered every NodePlan a fresh list of all
        of them showed. Mid-roll that list (~4 KB per NodePlan, ~3000 at 300 clusters)
        took longer than a look under load and was cut off at every look: a 10 x 300
        roll left the killed replica's clusters untouched for minutes (bench/README.md).
        The cache keeps the newer of two copies (resourceVersion), so a read never
        takes it back in time."""
        if not self.ready.is_set():
            return False
        # Every cluster of a taken shard, even one kept in full before: its shard may
        # have been given back and taken again between two passes (so never dropped),
        # with events kept foreign in between.
        todo = sorted(k for k in self.parts.known_clusters() if taken(k)
                      and k not in self._warmed)
        started, before = time.monotonic(), len(self._warmed)
        try:
            if len(todo) > self.reread_bulk:
                # Many at once (a replica's start-up takes all its shards): one list of
                # each resource, page by page, as the watches' first one, instead of a
                # label-selected list per cluster (each of which the API server answers
                # by looking at every object of the namespace).
                await self._reread_all(frozenset(todo))
                self._warmed.update(todo)
            else:
                await self._reread_each(todo)
        except KubeError as e:
            log.warning("re-reading the objects of a taken shard's clusters: %s", e)
            return False
        finally:
            if todo:  # also when the claims task cut this look off
                log.info("taken shards: %d of %d clusters read again in %.1fs",
                         len(self._warmed) - before, len(todo), time.monotonic() - started)
        if self.claims is not None:
            self._full.update(todo)
            # Their Clusters, K0sControlPlanes, MachineDeployments and MachineSets are kept
            # whole either way, compressed while foreign: kept plain again.
            for key in todo:
                self._rekeep_owners(key)
        self._warmed.clear()  # the shards warming now are acted on: the next take reads again
        return True

    async def _reread_each(self, todo: list[ClusterKey]) -> None:
        """Read the NodePlans of the clusters ``todo``, up to ``plans_per_list`` clusters
        per list (a set-based selector on Cluster API's cluster-name label), and each
        one's Machines and Secrets unless read ahead (:meth:`read_ahead`),
        ``reread_concurrency`` requests at a time; a cluster whose reads are all done
        stays done.
        Raises the first KubeError. (One NodePlan list per cluster, 8 at a time, took
        1.1-2.5 s each mid-roll at 10 x 300: a taker of 11 clusters waited two rounds,
        4.8 s; bench/README.md "Reading ahead of a take".) (Before, one cluster after the
        other took ~4 s each on a loaded API server, about as long as a look may last: a
        taker of 14 clusters read 0-2 per look and acted on them minutes later.)"""
        plans_read: set[ClusterKey] = set()
        rest_read: set[ClusterKey] = set()

        def read(keys: Sequence[ClusterKey], into: set[ClusterKey]) -> None:
            into.update(keys)
            self._warmed.update(k for k in keys if k in plans_read and k in rest_read)

        def plans(ns: str, keys: list[ClusterKey]) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                await self._reread_plans(ns, keys)
                read(keys, plans_read)
            return call

        def rest(key: ClusterKey) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                await self._reread_kept(key)
                read([key], rest_read)
            return call

        calls: list[Callable[[], Awaitable[None]]] = []
        by_ns: dict[str, list[ClusterKey]] = defaultdict(list)
        for key in todo:
            by_ns[key[0]].append(key)
        for ns, keys in sorted(by_ns.items()):
            for i in range(0, len(keys), self.plans_per_list):
                calls.append(plans(ns, keys[i:i + self.plans_per_list]))
        calls += [rest(k) for k in todo]
        await all_or_first_error(calls, self.reread_concurrency)

    async def _reread_plans(self, ns: str, keys: Sequence[ClusterKey]) -> None:
        """One list of the NodePlans of the clusters ``keys`` (of namespace ``ns``)."""
        values = ",".join(sorted({nodeplan.label_value(k[1]) for k in keys}))
        cache = self.view[NODE_PLANS]
        for obj in (await self.mgmt.list(NODE_PLANS, ns, label_selector=(
                f"{nodeplan.LABEL_CLUSTER} in ({values})"))).items:
            cache.observe(obj)

    def _rereads(self) -> tuple[tuple[Resource, str | None], ...]:
        """What a taken cluster's warm-up reads, with each list's field selector: its
        NodePlans, and with claims the Machines and Secrets kept foreign until then."""
        if self.claims is None:
            return ((NODE_PLANS, None),)
        return ((NODE_PLANS, None), (MACHINES, None), (SECRETS, SECRET_FIELD_SELECTOR))

    async def _reread_all(self, todo: frozenset[ClusterKey]) -> None:
        """Read every NodePlan, and with claims every Machine and Cluster API Secret
        (those of held clusters are kept in full now), again for the clusters ``todo``.
        A call cut off goes on where it
        stopped at the next call for the same clusters or fewer (pages read stay read); for
        more, or once the server no longer keeps the list's snapshot, from the start."""
        self._bulk.start(todo)
        for ns in self.view.namespaces:
            for res, fields in self._rereads():
                at = (ns, res.plural)
                if self._bulk.finished(at):
                    continue  # read in full by an earlier call
                try:
                    await self._reread_pages(res, ns, fields, at)
                except GoneError:  # that snapshot is gone: this list from the start
                    self._bulk.restart(at)
                    await self._reread_pages(res, ns, fields, at)
        self._bulk.reset()

    async def _reread_pages(self, res: Resource, ns: str | None, fields: str | None,
                            at: ListAt) -> None:
        cache = self.view[res]
        async for page in self.mgmt.list_pages(res, ns, field_selector=fields,
                                               page_size=self.reread_page_size,
                                               resume=self._bulk.resume_from(at)):
            for obj in page.items:
                cache.observe(obj)
            self._bulk.read(at, page.continue_token)
            self.bulk_pages_read += 1

    async def read_ahead(self, readying: Callable[[ClusterKey], bool]) -> None:
        """Clusters of shards that may be taken soon (``readying``: their holder missed a
        renewal): read their Machines and Secrets in full now and connect their workload
        clusters, so that the warm-up after a take has only their NodePlans left to read
        (which must follow the take: they count what the old holder dispatched). Nothing
        is acted on or written. Past ``reread_bulk`` clusters, nothing (the take reads
        them in one list of everything)."""
        kept_since = self.kept_since
        if self.claims is None or kept_since is None:
            return
        todo = sorted(k for k in self.parts.known_clusters() if readying(k)
                      and self._read_ahead.get(k) != kept_since(k))
        if not todo or len(todo) > self.reread_bulk:
            return
        started = time.monotonic()

        def ahead(key: ClusterKey) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                since = kept_since(key)  # as of before the read: a change meanwhile re-reads
                await self._reread_kept(key)
                self._read_ahead[key] = since
                self._full.add(key)  # projected down again if it is not taken after all
            return call

        try:
            await all_or_first_error([ahead(k) for k in todo], self.reread_concurrency)
        finally:
            log.info("read ahead: %d of %d clusters in %.1fs", sum(
                1 for k in todo if k in self._read_ahead), len(todo), time.monotonic() - started)

    def _read_in_full(self, key: ClusterKey) -> bool:
        """Whether the cluster's Machines and Secrets were read ahead and kept in full
        ever since (its shard did not stop being kept in between)."""
        return self.kept_since is not None and key in self._read_ahead and \
            self._read_ahead[key] == self.kept_since(key)

    async def _reread_kept(self, key: ClusterKey) -> None:
        """With claims, read one cluster's Machines and Cluster API Secrets (kept in full
        from now) again, unless read ahead and kept in full since; then connect it."""
        if self.claims is None:
            return
        if self._read_in_full(key):
            self._connect_early(key)  # (connected when read ahead, unless dropped since)
            return
        ns, name = key
        selector = f"{CAPI_CLUSTER_LABEL}={name}"

        async def machines() -> None:
            cache = self.view[MACHINES]
            listed = (await self.mgmt.list(MACHINES, ns, label_selector=selector)).items
            for obj in listed:
                cache.observe(obj)
            seen = {(ns, str((o.get("metadata") or {}).get("name") or "")) for o in listed}
            for mkey in sorted(self.parts.machine_keys(key) - seen):  # named by spec only
                found = await self.mgmt.get_or_none(MACHINES, mkey[1], mkey[0])
                if found is not None:
                    cache.observe(found)

        async def secrets() -> None:
            cache = self.view[SECRETS]
            for obj in (await self.mgmt.list(SECRETS, ns, label_selector=selector,
                                             field_selector=SECRET_FIELD_SELECTOR)).items:
                cache.observe(obj)
            self._connect_early(key)

        await all_or_first_error([machines, secrets], 2)

    def _connect_early(self, key: ClusterKey) -> None:
        """Connect a taken cluster now, while the rest of its warm-up reads: its Nodes are
        then listed by the time it is acted on. Connected after the warm-up, the first
        pass that planned it waited for that connection and three workload lists too
        (bench/README.md "Reading ahead of a take")."""
        if self.claims is None or not self.claims(key):
            return
        self._connected_early.add(key)
        self.registry.connect(key, kubeconfig_secrets(self.config, [key])[key])

    def _rekeep_owners(self, key: ClusterKey) -> None:
        """Keep one cluster's Cluster, K0sControlPlanes, MachineDeployments and MachineSets
        as its holding now says (compressed and unparsed while foreign: fleet/world/kept.py
        ``foreign``; kept whole either way, so nothing needs reading again)."""
        for res in (K0S_CONTROL_PLANES, MACHINE_DEPLOYMENTS, MACHINE_SETS):
            self.view[res].rekeep(self.parts.object_keys(res, key))
        self.view[CLUSTERS].rekeep([key])

    def _drop_given_back(self) -> None:
        """Keep only the foreign subset of the clusters whose shard claim this replica no
        longer holds, nor may take soon (fleet/world/kept.py)."""
        claims = self.claims
        if claims is None:
            return
        gone = [k for k in self._full if not claims(k)]
        if not gone:
            return
        secrets = kubeconfig_secrets(self.config, gone)
        # A bulk re-read under way read some pages while these were held: not to be
        # resumed for them if they are taken again (kept foreign from here on).
        self._bulk.reset()
        for key in gone:
            self._full.discard(key)
            self._read_ahead.pop(key, None)
            self.view[MACHINES].rekeep(self.parts.machine_keys(key))
            self.view[SECRETS].rekeep([(key[0], secrets[key])])
            self._rekeep_owners(key)
        log.info("%d clusters of shards given back (or not taken after all): their objects "
                 "kept foreign again", len(gone))

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
        shard = self.shard
        mine = set(members) if shard is None else {k for k in members if shard.acts_on(k)}
        if self.claims is not None:
            self._drop_given_back()
            self._full |= mine  # acted on: held (and read in full) since it was taken
        # Connected early, while its shard warms up: kept while the claim is held.
        early = {k for k in self._connected_early
                 if k not in mine and self.claims is not None and self.claims(k)}
        self._connected_early = early
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
                    if self.shard is not None and cluster is not None and \
                            not self.shard.acts_on(cluster):
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
