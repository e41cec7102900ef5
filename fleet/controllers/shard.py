"""Sharding the fleet's clusters across several active controller replicas.

Each replica announces itself with a member Lease (``<group>-replica-<identity>``,
renewed every ``lease/3``, each renewal cut off at 2/3 of the lease after the *start* of
the last good one, exactly as :mod:`fleet.controllers.leader`; renewed from a thread of
its own, :mod:`fleet.controllers.renewal`, so a busy main loop does not starve it).
Clusters are hashed into a fixed number of shards; each shard goes to one live replica by
rendezvous hashing (:func:`rendezvous_owner`), so a replica joining or leaving moves only
its own share.

Who may act on a shard is not decided by clocks alone: a shard has a claim Lease
(``<group>-shard-<n>``) whose ``holderIdentity`` is the only replica acting on its
clusters. Claims are written with the Lease's resourceVersion, so two replicas can never
both hold one (the API server answers the second writer 409). A claim changes hands in
two ways only:

* its holder gives it back (it is no longer the shard's rendezvous owner): it stops
  starting anything there first, waits until none of its actions on those clusters is in
  flight, then clears ``holderIdentity``;
* its holder is gone: its member Lease has not moved for ``expiry = renew_deadline +
  margin`` since this replica saw its last renewal, on this replica's monotonic clock.

Hand-off after a holder dies, and why it is safe. Every replica watches the Leases of
its group, so it sees a renewal (at local time ``s``) about when the API server stores
it, and looks at the claims again at ``s + expiry`` precisely (not at its next periodic
look). A look starts by noting the time ``n``, then lists the Leases afresh; it takes a
dead holder's claim only if that list still shows the renewal seen at ``s`` and
``n >= s + expiry``. The holder's renewal R started at ``t_R <= s`` (it was stored
before it was seen). The holder stops writing at ``t_R + renew_deadline`` on its own
clock (the write fence, :meth:`ShardMembership.holds`), and a renewal after R that
succeeded was stored before that instant too (each attempt is cut off at it), so a list
sent after ``n`` would show it. Hence when the claim is taken the holder has stopped
sending, provided its clock did not run slower than the taker's by more than ``margin``
over ``renew_deadline``: with NTP-disciplined clocks the rate error is at most 500 ppm,
5 ms over a 10 s deadline. The default margin (``lease/10``: 1.5 s with 15 s Leases)
covers that many times over, plus the requests the holder sent just before its deadline
that reach the server a little later. A write sent before the deadline and delayed
longer than the margin (a new TLS connection, a retransmission) can still arrive after
the take; it is harmless by construction, not by timing: a NodePlan's name is its
machine and version (a late create of one the new holder made is 409; one it did not
make is counted by the new holder's warm-up, which lists the NodePlans before planning,
and the new holder continues it rather than starting another node), a node signal
carries the plan's id (the agent acts once per plan id), and the shared records (the
rollout ConfigMap, claims) are written with resourceVersion preconditions (a late
write from an older read is 409). So a killed replica's clusters move about
``expiry`` after its last renewal, at most ``expiry`` + one look after the last one seen
(under 15 s with 15 s Leases: ``renew_deadline`` 10 s + 1.5 s), not a full lease after the
next poll. Timings this argument needs are checked (``0 <= margin <= lease -
renew_deadline``): a taker never moves before the holder must have stopped.

A newly taken shard is not acted on until the replica's management caches hold every
NodePlan a fresh list shows (``warm``): what the previous holder dispatched is counted
before this one plans. The controller's ``warm`` also reads its clusters' Machines and
kubeconfig Secrets again first: of clusters whose shard it did not hold it kept only a
subset (fleet/world/kept.py ``FOREIGN_SPECS``).

Reading ahead. A take at ``expiry`` used to be followed by the whole warm-up (three
lists per cluster) and then the workload connection (three more lists on another
server) before the first request. Once a live replica's member Lease has not moved for
``suspect_after`` (1.5 renewal periods: one renewal missed), the shards it holds that
would be this replica's without it are *readying*: the controller keeps their objects in
full, reads their Machines and kubeconfig Secrets and connects their workload clusters
(``read_ahead``, beside the looks, never delaying a take), all read-only. Nothing there
is planned or written before the claim is taken (``acts_on``, ``holds_cluster``), so a
replica that was only slow costs the others a few reads, dropped at their next pass.
The take's warm-up still lists the NodePlans after the claim (the argument above needs
that list); Machines and Secrets read ahead are not read again unless the shard stopped
being kept in full in between (``kept_since``).

Stopping "first" is the renewal thread's and the main loop's doing (the thread clears
``active``, the main loop then raises); a replica stopped past its deadline and then
resumed may run other tasks before noticing. So its writes are fenced one by one
(:meth:`ShardMembership.write_fence`, given to :meth:`fleet.kube.KubeClient.fenced`): none
is sent once the last good renewal started more than the renew deadline ago on its own
clock, nor one for a cluster whose shard it no longer holds (docs/controller.md).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc

from fleet.controllers.leader import lease_timings
from fleet.controllers.renewal import (
    Heartbeat,
    RenewalThread,
    Wake,
    renew_while_held,
    stall_bound,
)
from fleet.kube import AlreadyExistsError, ConflictError, KubeClient, KubeError, NotFoundError
from fleet.kube.resources import LEASES
from fleet.kube.watch import Reflector, WatchEvent
from fleet.world.fence import WriteFence, fleet_wide, lease_clock, write_cluster
from fleet.world.model import ClusterKey, format_time

log = logging.getLogger(__name__)

GROUP_LABEL = "fleet.k0s-fleet.io/lease-group"
ROLE_LABEL = "fleet.k0s-fleet.io/lease-role"
SHARDS_ANNOTATION = "fleet.k0s-fleet.io/shards"
REPLICA, SHARD = "replica", "shard"


class LostMembershipError(RuntimeError):
    """This replica's member Lease could not be renewed in time; it must stop acting."""


# -- pure -------------------------------------------------------------------------------


def shard_of(cluster: ClusterKey, shards: int) -> int:
    """The shard of a cluster: a stable hash of "namespace/name" modulo ``shards``."""
    digest = hashlib.sha256(f"{cluster[0]}/{cluster[1]}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def _weight(item: str, member: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{member}\x00{item}".encode()).digest()[:8], "big")


def rendezvous_owner(item: str, members: Iterable[str]) -> str | None:
    """Highest-random-weight owner of ``item`` among ``members`` (None when empty).

    Every replica computes the same answer from the same member set; removing a member
    moves only the items it owned, adding one moves only the items it now wins.
    """
    best: tuple[int, str] | None = None
    for m in members:
        w = (_weight(item, m), m)
        if best is None or w > best:
            best = w
    return None if best is None else best[1]


def assignment(shards: int, members: Sequence[str]) -> dict[int, str]:
    """Shard -> owning member, for every shard (empty when there is no member)."""
    if not members:
        return {}
    return {s: owner for s in range(shards)
            if (owner := rendezvous_owner(str(s), members)) is not None}


_INVALID = re.compile(r"[^a-z0-9-]+")


def member_lease_name(group: str, identity: str) -> str:
    slug = _INVALID.sub("-", identity.lower()).strip("-") or "replica"
    name = f"{group}-replica-{slug}"
    if len(name) > 253 or slug != identity:
        # Keep names valid and distinct: a digest of the identity disambiguates.
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        name = f"{group}-replica-{slug[:200]}-{digest}"
    return name


def shard_lease_name(group: str, shard: int) -> str:
    return f"{group}-shard-{shard}"


# -- I/O --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Seen:
    record: tuple[Any, ...]
    at: float  # monotonic time this replica saw ``record`` first


def _now() -> str:
    return format_time(datetime.now(UTC))


class ShardMembership:
    """This replica's membership and its shard claims (see the module docstring).

    ``acts_on(cluster)`` is what the controller asks before planning or acting on a
    cluster; ``busy()`` (given by the controller) names the clusters it has actions in
    flight on; ``warm()`` (optional) returns True once the caches are fresh enough to
    plan newly taken shards.
    """

    def __init__(self, client: KubeClient, *, namespace: str, identity: str,
                 group: str = "k0s-fleet-controller", shards: int = 32,
                 lease_seconds: int = 15, renew_every: float | None = None,
                 renew_deadline: float | None = None,
                 busy: Callable[[], Collection[ClusterKey]] = frozenset,
                 warm: Callable[[], Awaitable[bool]] | None = None,
                 on_change: Callable[[], None] | None = None,
                 stall_seconds: float | None = None,
                 on_stall: Callable[[str], None] | None = None,
                 handoff_margin: float | None = None,
                 monotonic: Callable[[], float] = lease_clock) -> None:
        if shards < 1:
            raise ValueError(f"shards must be at least 1, not {shards}")
        self.client = client
        self.namespace = namespace
        self.identity = identity
        self.group = group
        self.shards = shards
        self.lease_seconds = lease_seconds
        self.renew_every, self.renew_deadline = lease_timings(
            lease_seconds, renew_every, renew_deadline, what="sharding")
        self.stall_seconds = stall_bound(lease_seconds, stall_seconds, self.renew_deadline,
                                         what="sharding")
        self.on_stall = on_stall
        # A replica whose member Lease has not moved for renew_deadline + margin since it
        # was seen (on this replica's clock) is gone: see the module docstring.
        self.margin = lease_seconds / 10 if handoff_margin is None else handoff_margin
        if not 0 <= self.margin <= lease_seconds - self.renew_deadline:
            raise ValueError(f"sharding needs 0 <= handoff_margin ({self.margin}) <= "
                             f"lease_seconds - renew_deadline "
                             f"({lease_seconds - self.renew_deadline})")
        self.expiry = self.renew_deadline + self.margin
        self.busy = busy
        self.warm = warm
        self.on_change = on_change or (lambda: None)
        self.monotonic = monotonic
        self.member_name = member_lease_name(group, identity)
        self.held: set[int] = set()  # claims this replica holds
        self.releasing: set[int] = set()  # held, no longer ours: drain, then give back
        self.warming: set[int] = set()  # taken, caches not yet confirmed fresh
        self._taken_at: dict[int, float] = {}  # monotonic, per warming shard (for the log)
        # Read-ahead: a replica whose member Lease has not moved for ``suspect_after`` (one
        # renewal missed) may be gone. The shards it holds that would be this replica's
        # without it are "readying": their objects are kept in full, read again and their
        # workload clusters connected (``read_ahead``) before ``expiry``, so a take has
        # only their NodePlans left to read. Read-only: nothing there is acted on or
        # written before the claim is taken (acts_on, holds_cluster).
        self.suspect_after = self.renew_every * 1.5
        self.readying: set[int] = set()
        self.read_ahead: Callable[[], Awaitable[None]] | None = None
        self._claims_seen: dict[str, dict[str, Any]] = {}  # claim Leases, last look
        self._disagree = False  # the last look saw replicas with other shard counts
        self._kept: set[int] = set()  # held | readying, as last noted
        self._kept_epoch: dict[int, int] = {}  # shard -> times it became kept
        self._reading_ahead = False
        self.members: tuple[str, ...] = ()  # live replicas as last seen (sorted)
        # Set by the renewal thread (fleet.controllers.renewal), read by the main loop:
        self.active = False  # member Lease renewed within the deadline
        self.renewed_at: float | None = None  # monotonic start of the last good renewal
        self.problem: str | None = None  # why renewals stopped (for /healthz)
        self.handoffs = 0  # claims taken from a replica that stopped renewing
        self._seen: dict[str, _Seen] = {}
        self._expires: dict[str, float] = {}  # other live member Leases: when they expire
        self._wake: Wake | None = None
        self._member: dict[str, Any] | None = None

    # -- what the controller asks --------------------------------------------------------
    def acts_on(self, cluster: ClusterKey) -> bool:
        s = shard_of(cluster, self.shards)
        return self.active and s in self.held and s not in self.releasing \
            and s not in self.warming

    def keeps_full(self, cluster: ClusterKey) -> bool:
        """Whether the management caches keep the cluster's objects in full: this replica
        holds the claim on its shard (acting on it, warming up to, or draining it), or
        the shard is readying (may be taken soon)."""
        s = shard_of(cluster, self.shards)
        return s in self.held or s in self.readying

    def kept_since(self, cluster: ClusterKey) -> int:
        """How many times the cluster's shard began to be kept in full: unchanged since a
        read means everything since that read was kept in full too."""
        return self._kept_epoch.get(shard_of(cluster, self.shards), 0)

    def readying_cluster(self, cluster: ClusterKey) -> bool:
        """Whether the cluster's shard may be taken soon (its holder is overdue)."""
        return shard_of(cluster, self.shards) in self.readying

    def _note_kept(self) -> None:
        """Count each shard that began to be kept in full since the last call (called
        after every change of ``held`` or ``readying``, with no await in between)."""
        kept = self.held | self.readying
        for shard in kept - self._kept:
            self._kept_epoch[shard] = self._kept_epoch.get(shard, 0) + 1
        self._kept = kept

    def warming_cluster(self, cluster: ClusterKey) -> bool:
        """Whether the cluster's shard was taken and is not acted on yet (``warm``)."""
        return shard_of(cluster, self.shards) in self.warming

    def acting_shards(self) -> set[int]:
        return (self.held - self.releasing - self.warming) if self.active else set()

    # -- the write fence (fleet.kube.KubeClient.fenced) ----------------------------------
    def holds(self) -> bool:
        """The member Lease's last good renewal started less than the renew deadline ago
        on this process's own clock. Unlike ``active`` (cleared by the renewal task), this
        turns false the moment the clock says so: a replica resumed after a stop past its
        deadline writes nothing before its renewal task has run again."""
        return self.active and self.renewed_at is not None and \
            self.monotonic() < self.renewed_at + self.renew_deadline

    def holds_cluster(self, cluster: ClusterKey) -> bool:
        """:meth:`holds`, and the cluster's shard claim is this replica's in its last look
        at the claims (a shard being given back still counts: its actions in flight end
        before it is given back; one taken by another replica does not)."""
        return self.holds() and shard_of(cluster, self.shards) in self.held

    def remaining(self) -> float:
        """Seconds the member Lease is still known to be held on this replica's own clock
        (<= 0: not)."""
        if not self.active or self.renewed_at is None:
            return 0.0
        return self.renewed_at + self.renew_deadline - self.monotonic()

    def write_fence(self, fleet_writer: Callable[[], bool]) -> WriteFence:
        """The fence of this replica's writes (:meth:`fleet.kube.KubeClient.fenced`): a
        write for a cluster (:func:`fleet.world.fence.writes_for`) needs :meth:`holds_cluster`,
        any other :meth:`holds`; a fleet-wide one (:func:`fleet.world.fence.fleet_wide_writes`)
        also ``fleet_writer()`` (the writer Lease's own fence)."""
        def holds() -> bool:
            cluster = write_cluster()
            if not (self.holds() if cluster is None else self.holds_cluster(cluster)):
                return False
            return not fleet_wide() or fleet_writer()

        def remaining() -> float:
            left = self.remaining()
            writer_left = getattr(fleet_writer, "remaining", None)
            if fleet_wide() and writer_left is not None:
                left = min(left, writer_left())
            return left

        return WriteFence(holds, remaining)

    # -- the member Lease ----------------------------------------------------------------
    def _labels(self, role: str) -> dict[str, str]:
        return {GROUP_LABEL: self.group, ROLE_LABEL: role}

    async def _renew(self, client: KubeClient) -> None:
        """Create or renew this replica's member Lease (resourceVersion precondition)."""
        lease = self._member
        if lease is None:
            lease = await client.get_or_none(LEASES, self.member_name, self.namespace)
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "renewTime": _now()}
        meta: dict[str, Any] = {"name": self.member_name, "namespace": self.namespace,
                                "labels": self._labels(REPLICA),
                                "annotations": {SHARDS_ANNOTATION: str(self.shards)}}
        if lease is None:
            spec["acquireTime"] = spec["renewTime"]
            try:
                self._member = await client.create(
                    LEASES, {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
                             "metadata": meta, "spec": spec}, self.namespace)
                return
            except AlreadyExistsError:
                lease = await client.get(LEASES, self.member_name, self.namespace)
        meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        body = {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": meta,
                "spec": {**(lease.get("spec") or {}), **spec}}
        try:
            self._member = await client.replace(LEASES, body)
        except (ConflictError, NotFoundError):
            self._member = None  # re-read next time (someone edited or deleted it)
            raise

    async def _attempt_renew(self, client: KubeClient, deadline: float) -> bool:
        with anyio.move_on_after(deadline) as scope:
            try:
                await self._renew(client)
                return True
            except KubeError as e:
                log.warning("member lease %s/%s: %s", self.namespace, self.member_name, e)
                return False
        if scope.cancelled_caught:
            self._member = None
            log.warning("member lease %s/%s: no answer within %.1fs", self.namespace,
                        self.member_name, deadline)
        return False

    # -- observing the others ------------------------------------------------------------
    def _observe(self, key: str, record: tuple[Any, ...], now: float) -> _Seen:
        seen = self._seen.get(key)
        if seen is None or seen.record != record:
            seen = self._seen[key] = _Seen(record, now)
        return seen

    def _live_members(self, leases: Sequence[dict[str, Any]], now: float
                      ) -> tuple[list[str], dict[str, int]]:
        """Live replica identities (self included) and the shard counts they announce."""
        self._expires.clear()
        live = {self.identity}
        counts: dict[str, int] = {}
        present: set[str] = set()
        for lease in leases:
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            name = lease["metadata"]["name"]
            present.add(name)
            seen = self._observe(name, (holder, spec.get("renewTime"),
                                        lease["metadata"].get("resourceVersion")), now)
            if not holder or holder == self.identity:
                continue
            duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
            expires = seen.at + duration * self.expiry / self.lease_seconds
            if now < expires:
                live.add(holder)
                self._expires[name] = expires
                try:
                    counts[holder] = int(((lease["metadata"].get("annotations") or {})
                                          .get(SHARDS_ANNOTATION)) or self.shards)
                except ValueError:
                    counts[holder] = -1
        for name in list(self._seen):
            if name.startswith(f"{self.group}-replica-") and name not in present:
                self._observe(name, ("absent",), now)
        return sorted(live), counts

    def _holder_alive(self, holder: str, now: float) -> bool:
        """Whether ``holder`` may still be acting: its member Lease moved within
        ``expiry`` (renew deadline + margin) on this replica's clock before ``now``, the
        time this look began (absent leases count from when first missed)."""
        seen = self._seen.get(member_lease_name(self.group, holder))
        if seen is None:
            seen = self._observe(member_lease_name(self.group, holder), ("unseen",), now)
        return now - seen.at < self.expiry

    def next_expiry(self) -> float | None:
        """When (monotonic) the next member Lease seen live expires, unless it moves."""
        return min(self._expires.values(), default=None)

    def _last_seen(self, holder: str) -> float | None:
        seen = self._seen.get(member_lease_name(self.group, holder))
        return None if seen is None else seen.at

    def next_suspicion(self) -> float | None:
        """When (monotonic, from now on) the next live replica becomes overdue (one
        renewal missed), unless its member Lease moves: known from the Lease watch, so
        checked without a request (:meth:`_suspect`)."""
        if self.suspect_after >= self.expiry:
            return None
        now = self.monotonic()
        return min((t for h in self.members if h != self.identity
                    and (at := self._last_seen(h)) is not None
                    and (t := at + self.suspect_after) > now), default=None)

    async def _on_lease(self, event: WatchEvent) -> None:
        """A Lease of the group changed (the watch): a member Lease's renewal is seen now
        (sooner than the next look would); a claim given back, a member come or gone
        wakes the rebalancing at once."""
        obj = event.object
        meta = obj.get("metadata") or {}
        role = (meta.get("labels") or {}).get(ROLE_LABEL)
        if role == REPLICA and event.type != "DELETED":
            spec = obj.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            self._observe(meta.get("name", ""), (holder, spec.get("renewTime"),
                                                 meta.get("resourceVersion")),
                          self.monotonic())
            if (not holder or holder in self.members) and not self.readying:
                return  # a renewal: nothing to rebalance (readying: perhaps no longer)
        if self._wake is not None:
            self._wake.set()

    # -- claims --------------------------------------------------------------------------
    def _claim_body(self, shard: int, lease: dict[str, Any] | None, holder: str | None
                    ) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        now = _now()
        if holder is not None:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if lease is not None else 0)
        spec.update(holderIdentity=holder, leaseDurationSeconds=self.lease_seconds,
                    renewTime=now)
        meta: dict[str, Any] = {"name": shard_lease_name(self.group, shard),
                                "namespace": self.namespace, "labels": self._labels(SHARD)}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": meta,
                "spec": spec}

    async def _take(self, shard: int, lease: dict[str, Any] | None) -> bool:
        try:
            if lease is None:
                await self.client.create(LEASES, self._claim_body(shard, None, self.identity),
                                         self.namespace)
            else:
                await self.client.replace(LEASES, self._claim_body(shard, lease, self.identity))
        except (AlreadyExistsError, ConflictError, NotFoundError):
            return False  # another replica moved first: its claim stands
        return True

    async def _take_all(self, claims: Sequence[tuple[int, dict[str, Any] | None]]
                        ) -> tuple[list[bool], KubeError | None]:
        """:meth:`_take` each of ``claims`` at the same time: whether each was taken, and
        the first KubeError among them (None when none failed)."""
        took = [False] * len(claims)
        failed: list[KubeError] = []

        slots = anyio.CapacityLimiter(16)  # a first replica takes every shard at once

        async def take(i: int, shard: int, lease: dict[str, Any] | None) -> None:
            async with slots:
                try:
                    took[i] = await self._take(shard, lease)
                except KubeError as e:
                    failed.append(e)

        async with anyio.create_task_group() as tg:
            for i, (shard, lease) in enumerate(claims):
                tg.start_soon(take, i, shard, lease)
        return took, (failed[0] if failed else None)

    async def _give_back(self, shard: int, lease: dict[str, Any] | None) -> bool:
        if lease is None:
            return True
        if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return True
        try:
            await self.client.replace(LEASES, self._claim_body(shard, lease, None))
        except (ConflictError, NotFoundError):
            return False
        return True

    def _busy_shards(self) -> set[int]:
        return {shard_of(c, self.shards) for c in self.busy()}

    async def _rebalance(self) -> None:
        """One look at the members and the claims: give back, take over (warmed up by
        :meth:`_warm_up` after the look)."""
        now = self.monotonic()
        selector = f"{GROUP_LABEL}={self.group}"
        leases = (await self.client.list(LEASES, self.namespace,
                                         label_selector=selector)).items
        members = [x for x in leases if (x["metadata"].get("labels") or {}).get(ROLE_LABEL)
                   == REPLICA]
        claims = {x["metadata"]["name"]: x for x in leases
                  if (x["metadata"].get("labels") or {}).get(ROLE_LABEL) == SHARD}
        live, counts = self._live_members(members, now)
        disagree = sorted(h for h, n in counts.items() if n != self.shards)
        if tuple(live) != self.members:
            log.info("%s: live replicas %s", self.identity, ", ".join(live))
            self.members = tuple(live)
        owners = assignment(self.shards, live)
        busy = self._busy_shards()
        changed = False
        to_take: list[tuple[int, dict[str, Any] | None, str, float]] = []
        for shard in range(self.shards):
            lease = claims.get(shard_lease_name(self.group, shard))
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
            if holder == self.identity and shard not in self.held:
                # A claim this identity took before a restart of this process: the old
                # process is gone (same identity = same pod), adopt it after warming.
                self.held.add(shard)
                self.warming.add(shard)
                self._note_kept()
                changed = True
            if holder != self.identity and shard in self.held:
                log.warning("%s: claim on shard %d now held by %r; stopping there",
                            self.identity, shard, holder)
                self.held.discard(shard)
                self.releasing.discard(shard)
                self.warming.discard(shard)
                self._note_kept()
                changed = True
            mine = owners.get(shard) == self.identity
            if shard in self.held:
                if mine:
                    if shard in self.releasing:
                        self.releasing.discard(shard)
                        changed = True
                    continue
                if shard not in self.releasing:
                    self.releasing.add(shard)  # stop starting anything there
                    changed = True
                    continue
                if shard in busy:
                    continue  # actions in flight: give back once they are done
                if await self._give_back(shard, lease):
                    log.info("%s: gave shard %d back (owner now %s)", self.identity, shard,
                             owners.get(shard))
                    self.held.discard(shard)
                    self.releasing.discard(shard)
                    self.warming.discard(shard)
                    self._note_kept()
                    changed = True
                continue
            if not mine or disagree:
                continue
            if holder and self._holder_alive(holder, now):
                continue  # the holder gives it back once it sees the new owner
            # As the decision saw it: the holder's lease may be seen again during the take
            # (a restarted holder renewing), which must not make the logged age negative.
            age = now - self._seen[member_lease_name(self.group, holder)].at if holder \
                else 0.0
            to_take.append((shard, lease, holder, age))
        # All at once: each claim is a compare-and-swap of its own Lease. One after the
        # other, a taker of 4 shards wrote its last claim 1.2 s after its first on a
        # loaded API server, and its warm-up waited for them all (bench/README.md
        # "Claims taken at once").
        taken, failure = await self._take_all([(s, lease) for s, lease, _, _ in to_take])
        for (shard, _, holder, age), took in zip(to_take, taken, strict=True):
            if not took:
                continue
            if holder:
                self.handoffs += 1
                log.warning("%s: took shard %d from %s (its member lease stopped "
                            "moving: last seen %.2fs before this look began, expiry "
                            "%.2fs)", self.identity, shard, holder, age, self.expiry)
            else:
                log.info("%s: took shard %d", self.identity, shard)
            self.held.add(shard)
            self.warming.add(shard)
            self._taken_at[shard] = self.monotonic()
            self._note_kept()
            changed = True
        self._claims_seen, self._disagree = claims, bool(disagree)
        if self._set_readying(self._overdue_shards(claims, live, now)):
            changed = True
        if disagree:
            log.error("%s: replicas %s announce a different shard count than %d; taking no "
                      "new shards until every replica runs with the same --shards",
                      self.identity, ", ".join(disagree), self.shards)
        if changed:
            self.on_change()
        if failure is not None:
            raise failure  # the look failed (what the other claims took is recorded)

    def _overdue_shards(self, claims: dict[str, dict[str, Any]], live: Sequence[str],
                        now: float) -> set[int]:
        """The shards held by live replicas overdue at ``now`` (one renewal missed, as the
        Lease watch and the looks saw them) that would be this replica's if they were
        gone."""
        if self._disagree or self.suspect_after >= self.expiry:
            return set()
        overdue = [h for h in live if h != self.identity and (at := self._last_seen(h))
                   is not None and now - at >= self.suspect_after]
        if not overdue:
            return set()
        out: set[int] = set()
        for holder in overdue:
            without = assignment(self.shards, [m for m in live if m != holder])
            for shard in range(self.shards):
                lease = claims.get(shard_lease_name(self.group, shard))
                if ((lease or {}).get("spec") or {}).get("holderIdentity") == holder \
                        and without.get(shard) == self.identity:
                    out.add(shard)
        return out - self.held

    def _set_readying(self, readying: set[int]) -> bool:
        """Make ``readying`` this (logged); whether it changed."""
        if readying == self.readying:
            return False
        if readying - self.readying:
            log.info("%s: shards %s may be taken soon (their holder is overdue): read "
                     "ahead", self.identity, ",".join(map(str, sorted(readying -
                                                                        self.readying))))
        self.readying = readying
        self._note_kept()
        return True

    def _suspect(self, tg: anyio.abc.TaskGroup) -> None:
        """Between looks, at an instant a live replica may have become overdue: readying
        from what is known (the watch's renewals, the last look's claims), no request;
        the read-ahead started when there is something to read."""
        if self._set_readying(self._overdue_shards(self._claims_seen, self.members,
                                                   self.monotonic())):
            self.on_change()
        self._start_read_ahead(tg)

    def _start_read_ahead(self, tg: anyio.abc.TaskGroup) -> None:
        if self.readying and self.read_ahead is not None and not self._reading_ahead:
            self._reading_ahead = True  # beside the looks: a take waits for none
            tg.start_soon(self._read_ahead)

    async def _read_ahead(self) -> None:
        """``read_ahead()`` once, bounded by a lease; a failure is only logged (the take
        reads what is missing)."""
        assert self.read_ahead is not None
        try:
            with anyio.move_on_after(self.lease_seconds):
                await self.read_ahead()
        except KubeError as e:
            log.info("%s: reading ahead: %s", self.identity, e)
        finally:
            self._reading_ahead = False

    async def _warm_up(self) -> None:
        """The shards taken and not yet acted on: once ``warm()`` says the caches are
        fresh enough for them, acted on from now. Called after a look, with a bound of its
        own (the run loop's), not with what a look left of its bound."""
        if not self.warming or not (self.warm is None or await self.warm()):
            return
        now = self.monotonic()
        taken = [self._taken_at.pop(s, now) for s in self.warming]
        log.info("%s: shards %s warm, acted on from now (%.1fs after the first was "
                 "taken)", self.identity, ",".join(map(str, sorted(self.warming))),
                 now - min(taken))
        self.warming.clear()
        self.on_change()

    async def release_all(self) -> None:
        """Give back every claim and the member Lease (after the controller stopped)."""
        self.active = False
        for shard in sorted(self.held):
            try:
                lease = await self.client.get_or_none(LEASES, shard_lease_name(self.group,
                                                                               shard),
                                                      self.namespace)
                await self._give_back(shard, lease)
            except KubeError as e:
                log.info("could not give back shard %d: %s", shard, e)
        self.held.clear()
        self.readying.clear()
        self._note_kept()
        try:
            lease = await self.client.get_or_none(LEASES, self.member_name, self.namespace)
            if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == \
                    self.identity:
                lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
                await self.client.replace(LEASES, lease)
        except KubeError as e:
            log.info("could not release member lease: %s", e)

    async def _keep(self, client: KubeClient, wake: Wake, heartbeat: Heartbeat) -> None:
        """The member Lease's renewals, on the renewal thread (``client`` is its own):
        every ``renew_every``, each cut off at the renew deadline after the start of the
        last good one; past that deadline, or once the main loop stalled past its bound,
        no more (``active`` cleared, ``problem`` says why, the main loop woken)."""
        try:
            while True:
                started = self.monotonic()
                if await self._attempt_renew(client, self.renew_deadline):
                    break
                await anyio.sleep(self.renew_every / 2)
            self.renewed_at = started
            self.active = True
            wake.set()

            def renewed(at: float) -> None:
                self.renewed_at = at

            end = await renew_while_held(
                lease=f"member lease {self.namespace}/{self.member_name}",
                identity=self.identity,
                attempt=lambda left: self._attempt_renew(client, left), renewed=renewed,
                last_ok=started, heartbeat=heartbeat, renew_every=self.renew_every,
                renew_deadline=self.renew_deadline, monotonic=self.monotonic)
            self.problem = end.problem
            self.active = False
            wake.set()
            if end.stalled and self.on_stall is not None:
                self.on_stall(self.problem)
        finally:
            self.active = False

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Announce (the member Lease renewed on a thread of its own: RenewalThread),
        rebalance every ``renew_every`` until cancelled; raises
        :class:`LostMembershipError` when the member Lease was not renewed in time."""
        self.problem = None
        wake = Wake()
        heartbeat = Heartbeat(self.stall_seconds, monotonic=self.monotonic)
        thread = RenewalThread("member-lease", self.client)
        lost: LostMembershipError | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(heartbeat.run)
                thread.start(lambda client: self._keep(client, wake, heartbeat), wake.set)
                self._wake = wake
                tg.start_soon(Reflector(
                    self.client, LEASES, namespace=self.namespace, keep_objects=False,
                    label_selector=f"{GROUP_LABEL}={self.group}", listener=self._on_lease,
                    watch_timeout=300).run)
                try:
                    while not self.active:
                        self._check(thread)
                        await wake.wait(self.renew_every)
                    log.info("%s: member of %s (%d shards)", self.identity, self.group,
                             self.shards)
                    task_status.started()
                    while True:
                        self._check(thread)
                        with anyio.move_on_after(self.renew_every):
                            try:
                                await self._rebalance()
                            except KubeError as e:
                                log.warning("%s: shard claims: %s", self.identity, e)
                        self._check(thread)
                        self._start_read_ahead(tg)
                        if self.warming:
                            # Its own bound, not what the look left of one: a taken
                            # cluster's three lists took 1.5-2.5 s on a loaded API server,
                            # and a look that took shards late left 0.5-2 s, cutting them
                            # off again and again (10 x 100: takers warm up to 12.4 s after
                            # the take; bench/README.md). Cut off, it goes on next look.
                            with anyio.move_on_after(self.renew_every):
                                await self._warm_up()
                            self._check(thread)
                        # Next look: at the next expiry of a member Lease seen live (the
                        # instant its holder's claims may be taken), a Lease event, or
                        # renew_every (claims given back are also seen by the watch).
                        pause = self.renew_every
                        if (expires := self.next_expiry()) is not None:
                            pause = min(pause, expires - self.monotonic() + 0.01)
                        if self.warming:  # a warm-up cut off by the look's bound goes on
                            pause = min(pause, 0.1)
                        # Until then, at each instant a live replica becomes overdue, a
                        # check of what is known (no request): looks at those instants
                        # would list the Leases for each of them, and one running across
                        # such an instant missed it.
                        look_at = self.monotonic() + pause
                        while (due := self.next_suspicion()) is not None and due < look_at:
                            if await wake.wait(due - self.monotonic() + 0.01):
                                break
                            self._suspect(tg)
                        else:
                            await wake.wait(look_at - self.monotonic())
                except LostMembershipError as e:
                    lost = e  # raised below, not wrapped in the task group's error group
                tg.cancel_scope.cancel()
        finally:
            self._wake = None
            self.active = False
            await thread.stop_and_join(self.renew_deadline)
        if lost is not None:
            raise lost

    def _check(self, thread: RenewalThread) -> None:
        """Raise :class:`LostMembershipError` once the renewal thread stopped renewing."""
        if self.problem is None and (thread.running or self.active):
            return
        self.active = False
        self.on_change()
        why = self.problem or (f"renewal thread ended: {thread.error!r}"
                               if thread.error else "renewal thread ended")
        raise LostMembershipError(f"{self.identity}: {why}")
