"""Reading ahead of a take, the membership's pure part (no server): which shards a replica
readies when another one misses a renewal, when it looks for that, and what it lets the
controller keep, act on and write while a shard is readying (issue #13, hand-off)."""

from __future__ import annotations

from typing import Any

from fleet.controllers.shard import (
    GROUP_LABEL,
    REPLICA,
    ROLE_LABEL,
    SHARD,
    SHARDS_ANNOTATION,
    ShardMembership,
    assignment,
    member_lease_name,
    shard_lease_name,
    shard_of,
)
from fleet.kube import KubeClient
from fleet.world.model import ClusterKey
from tests.helpers.clock import FakeClock

SHARDS = 32
GROUP = "k0s-fleet-controller"
T0 = 1000.0


def _membership(clock: FakeClock) -> ShardMembership:
    client = KubeClient.__new__(KubeClient)  # never sends: its state is set by hand
    return ShardMembership(client, namespace="ns", identity="ctl-a", shards=SHARDS,
                           lease_seconds=15, monotonic=clock)


def _member(identity: str, renew: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": member_lease_name(GROUP, identity), "resourceVersion": rv,
                         "labels": {GROUP_LABEL: GROUP, ROLE_LABEL: REPLICA},
                         "annotations": {SHARDS_ANNOTATION: str(SHARDS)}},
            "spec": {"holderIdentity": identity, "renewTime": renew,
                     "leaseDurationSeconds": 15}}


def _claims(owners: dict[int, str]) -> dict[str, dict[str, Any]]:
    return {shard_lease_name(GROUP, s): {
        "metadata": {"name": shard_lease_name(GROUP, s),
                     "labels": {GROUP_LABEL: GROUP, ROLE_LABEL: SHARD}},
        "spec": {"holderIdentity": h}} for s, h in owners.items()}


def _look(m: ShardMembership, claims: dict[str, dict[str, Any]], leases: list[dict[str, Any]],
          now: float) -> set[int]:
    live, _ = m._live_members(leases, now)
    m.members = tuple(live)
    return m._overdue_shards(claims, live, now)


def _cluster_in(shard: int) -> ClusterKey:
    return next(k for k in (("ns", f"c{i}") for i in range(100_000))
                if shard_of(k, SHARDS) == shard)


def test_a_replica_missing_one_renewal_readies_exactly_what_it_would_take() -> None:
    clock = FakeClock(T0)
    m = _membership(clock)
    members = ["ctl-a", "ctl-b", "ctl-c"]
    owners = assignment(SHARDS, members)
    claims = _claims(owners)
    leases = [_member(x, "t0", "1") for x in members]
    # Seen renewed at T0 (the first look), then not again.
    assert _look(m, claims, leases, T0) == set()
    assert m.suspect_after == 7.5 and m.expiry == 11.5
    # Checked (without a request) when the renewal is one period late, before the expiry.
    assert m.next_suspicion() == T0 + 7.5 and m.next_expiry() == T0 + 11.5
    clock.now = T0 + 7.4
    assert _look(m, claims, leases, clock.now) == set()
    clock.now = T0 + 7.5
    overdue = _look(m, claims, leases, clock.now)
    # ctl-b and ctl-c both overdue here: what ctl-a would take from either of them.
    wanted = {s for s, h in owners.items() if h == "ctl-b"
              and assignment(SHARDS, ["ctl-a", "ctl-c"])[s] == "ctl-a"} | \
        {s for s, h in owners.items() if h == "ctl-c"
         and assignment(SHARDS, ["ctl-a", "ctl-b"])[s] == "ctl-a"}
    assert wanted and overdue == wanted
    assert not overdue & {s for s, h in owners.items() if h == "ctl-a"}
    # Past the suspicion, nothing more to check before the expiry's look.
    assert m.next_suspicion() is None and m.next_expiry() == T0 + 11.5
    # ctl-c renews: only ctl-b's shards stay readying, its own are no longer ctl-a's.
    leases = [_member("ctl-a", "t0", "1"), _member("ctl-b", "t0", "1"),
              _member("ctl-c", "t8", "2")]
    clock.now = T0 + 8.0
    overdue = _look(m, claims, leases, clock.now)
    assert overdue == {s for s in wanted if owners[s] == "ctl-b"}
    assert m.next_suspicion() == T0 + 15.5
    # Replicas announcing different shard counts: nothing is readied (nor taken).
    m._disagree = True
    assert _look(m, claims, leases, clock.now) == set()


def test_a_readying_shard_is_kept_in_full_not_acted_on_nor_written_and_counted_once() -> None:
    clock = FakeClock(T0)
    m = _membership(clock)
    m.active, m.renewed_at = True, T0
    cluster = _cluster_in(5)
    assert not m.keeps_full(cluster) and m.kept_since(cluster) == 0
    assert m._set_readying({5})
    assert not m._set_readying({5})  # unchanged
    assert m.keeps_full(cluster) and m.readying_cluster(cluster)
    assert not m.acts_on(cluster) and not m.holds_cluster(cluster)
    assert m.kept_since(cluster) == 1
    # Taken: held (warming), still kept; the same count (nothing was dropped between).
    m.held.add(5)
    m.warming.add(5)
    m._note_kept()
    assert m._set_readying(set())
    assert m.keeps_full(cluster) and m.kept_since(cluster) == 1
    assert not m.acts_on(cluster) and m.holds_cluster(cluster)
    # Given back, then readying again: counted again (what was read then is stale).
    m.held.discard(5)
    m.warming.discard(5)
    m._note_kept()
    assert not m.keeps_full(cluster)
    m._set_readying({5})
    assert m.kept_since(cluster) == 2
    # Other shards are not counted.
    assert m.kept_since(_cluster_in(6)) == 0
