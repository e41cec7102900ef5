"""The sharded take-over: what a replica that shares the fleet with others reads and keeps
of the clusters whose shard it takes, may soon take, or gave back
(fleet.controllers.shard decides the claims; this is the controller's side of them).

A single replica has none of this: its controller is given no :class:`Takeover`. A
sharded one plans only the clusters its shard claims let it act on, keeps in full only
the objects of the clusters it holds (fleet/world/kept.py), reads a taken shard's
clusters again before acting on them (:meth:`ShardTakeover.warm_taken`), reads ahead of
a take that may come (:meth:`ShardTakeover.read_ahead`) and connects those clusters
early, and keeps the foreign subset again of what it gave back.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

from fleet.config.models import FleetConfig
from fleet.contract import nodeplan
from fleet.controllers.handoff import BulkReread, ListAt
from fleet.controllers.observe import SECRET_FIELD_SELECTOR, ManagementView, kubeconfig_secrets
from fleet.controllers.parts import FleetParts
from fleet.controllers.shard import ShardMembership
from fleet.kube import GoneError, KubeClient, KubeError
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
from fleet.world.clusters import ClusterRegistry
from fleet.world.kept import CAPI_CLUSTER_LABEL
from fleet.world.model import ClusterKey

log = logging.getLogger(__name__)


class Shard(Protocol):
    """Which clusters this replica acts on (fleet.controllers.shard.ShardMembership)."""

    def acts_on(self, cluster: ClusterKey) -> bool: ...


@dataclass(frozen=True)
class Sharding:
    """What a sharded replica's membership tells its controller: ``shard``, the clusters
    it acts on; ``claims``, whether it keeps a cluster's objects in full (it holds, or
    may soon take, the claim on its shard; of the other clusters less is kept, re-read
    by :meth:`ShardTakeover.warm_taken` before acting on them); ``kept_since``, a number
    that changes whenever a cluster begins to be kept in full (what
    :meth:`ShardTakeover.read_ahead` read stays complete while it does not)."""

    shard: Shard
    claims: Callable[[ClusterKey], bool] | None = None
    kept_since: Callable[[ClusterKey], int] | None = None

    @classmethod
    def of(cls, membership: ShardMembership) -> Sharding:
        """What ``membership`` tells (its shards, claims and read-ahead)."""
        return cls(membership, membership.keeps_full, membership.kept_since)


class Takeover(Protocol):
    """What the controller's pass asks of the sharded take-over (None: a single replica,
    which acts on every cluster of the fleet)."""

    def acts_on(self, cluster: ClusterKey) -> bool:
        """Whether this replica may plan and act on the cluster now."""
        ...

    def keep(self, mine: set[ClusterKey]) -> set[ClusterKey]:
        """Called by each pass with the clusters this replica acts on: what it gave back is
        kept foreign again, what it acts on is kept in full; returns the other clusters
        whose workload connection is kept (connected early, while their shard warms)."""
        ...


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


class ShardTakeover:
    """The controller's side of a sharded replica's shard claims (see the module
    docstring); its membership asks :meth:`busy_clusters`, :meth:`warm_taken` and
    :meth:`read_ahead` (fleet/cli/controller.py)."""

    def __init__(self, sharding: Sharding, *, mgmt: KubeClient, config: FleetConfig,
                 view: ManagementView, registry: ClusterRegistry, parts: FleetParts,
                 ready: anyio.Event, busy: Mapping[ClusterKey | None, int]) -> None:
        """``ready``: set once the controller's management caches synced; ``busy``: its
        actions in flight (or queued) per cluster (None: not known)."""
        self.mgmt = mgmt
        self.config = config
        self.view = view
        self.registry = registry
        self.parts = parts
        self.ready = ready
        # The clusters this replica acts on, and its actions in flight per cluster
        # (None: not known) so a shard is given back only once they are done.
        self.shard = sharding.shard
        self._busy = busy
        self.claims = sharding.claims
        # Clusters whose objects are kept in full (re-read when their shard was
        # taken, or acted on since), projected down again once their shard is given back.
        self._full: set[ClusterKey] = set()
        self._warmed: set[ClusterKey] = set()  # re-read for the shards warming now
        # Clusters of shards being taken whose workload client was started as soon as
        # their kubeconfig Secret was read in full (before they are acted on).
        self._connected_early: set[ClusterKey] = set()
        self.kept_since = sharding.kept_since
        # Read ahead (Machines and Secrets in full), with kept_since as of that read.
        self._read_ahead: dict[ClusterKey, int] = {}
        # More clusters than this to re-read at once: one list of everything instead,
        # its progress kept when a call is cut off.
        self.reread_bulk = 64
        self.reread_concurrency = 8  # lists at once while re-reading (below reread_bulk)
        self.plans_per_list = 50  # taken clusters whose NodePlans one list reads
        self._bulk = BulkReread()
        self.reread_page_size = 500
        self.bulk_pages_read = 0

    def serve(self, membership: ShardMembership) -> None:
        """Answer what ``membership`` asks the controller: the clusters with actions in
        flight (a shard is given back once they are done), whether newly taken shards
        are warm, and the read-ahead of shards that may be taken soon."""
        membership.busy = self.busy_clusters
        membership.warm = functools.partial(self.warm_taken, membership.warming_cluster)
        membership.read_ahead = functools.partial(self.read_ahead,
                                                  membership.readying_cluster)

    def acts_on(self, cluster: ClusterKey) -> bool:
        return self.shard.acts_on(cluster)

    def keep(self, mine: set[ClusterKey]) -> set[ClusterKey]:
        if self.claims is not None:
            self._drop_given_back()
            self._full |= mine  # acted on: held (and read in full) since it was taken
        # Connected early, while its shard warms up: kept while the claim is held.
        early = {k for k in self._connected_early
                 if k not in mine and self.claims is not None and self.claims(k)}
        self._connected_early = early
        return early

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
