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

import logging
from collections.abc import Callable

import anyio
import anyio.abc

from fleet.controllers.assignment import (
    GROUP_LABEL,
    REPLICA,
    ROLE_LABEL,
    SHARD,
    SHARDS_ANNOTATION,
    assignment,
    member_lease_name,
    rendezvous_owner,
    shard_lease_name,
    shard_of,
)
from fleet.controllers.claims import ShardClaims
from fleet.controllers.renewal import Heartbeat, RenewalThread, Wake
from fleet.kube import KubeError
from fleet.kube.resources import LEASES
from fleet.kube.watch import Reflector
from fleet.world.fence import WriteFence, fleet_wide, write_cluster
from fleet.world.model import ClusterKey

log = logging.getLogger(__name__)

__all__ = [
    "GROUP_LABEL",
    "REPLICA",
    "ROLE_LABEL",
    "SHARD",
    "SHARDS_ANNOTATION",
    "LostMembershipError",
    "ShardMembership",
    "assignment",
    "member_lease_name",
    "rendezvous_owner",
    "shard_lease_name",
    "shard_of",
]


class LostMembershipError(RuntimeError):
    """This replica's member Lease could not be renewed in time; it must stop acting."""


class ShardMembership(ShardClaims):
    """This replica's membership and its shard claims (see the module docstring; its
    state: fleet.controllers.shardstate, its member Lease and the others':
    fleet.controllers.members, its claims: fleet.controllers.claims).

    ``acts_on(cluster)`` is what the controller asks before planning or acting on a
    cluster; ``busy()`` (given by the controller) names the clusters it has actions in
    flight on; ``warm()`` (optional) returns True once the caches are fresh enough to
    plan newly taken shards.
    """

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
