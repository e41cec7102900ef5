"""A sharded replica's settings and state, shared by the parts of its membership
(fleet.controllers.members, fleet.controllers.claims, fleet.controllers.shard): its
lease timings, the claims it holds, takes, gives back or readies, the other replicas as
last seen, and what the renewal thread sets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from fleet.controllers.assignment import member_lease_name
from fleet.controllers.leader import lease_timings
from fleet.controllers.renewal import Wake, stall_bound
from fleet.kube import KubeClient
from fleet.world.fence import lease_clock
from fleet.world.model import ClusterKey


@dataclass(slots=True)
class Seen:
    record: tuple[Any, ...]
    at: float  # monotonic time this replica saw ``record`` first


class ShardState:
    """The settings and state of :class:`fleet.controllers.shard.ShardMembership`."""

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
        # was seen (on this replica's clock) is gone: see fleet.controllers.shard.
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
        self._seen: dict[str, Seen] = {}
        self._expires: dict[str, float] = {}  # other live member Leases: when they expire
        self._wake: Wake | None = None
        self._member: dict[str, Any] | None = None
