"""Shard membership and claims, and admission by compare-and-swap of the rollout record,
on a real kube-apiserver (fleet.controllers.shard, fleet.rollout.coordinator).

Several ShardMembership instances share one namespace. A sampler checks, every 20 ms,
that no shard is ever acted on by two of them; the claim Leases themselves (written with
resourceVersion preconditions) are read back to check who holds what.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.abc
import pytest

from fleet.config.models import FleetConfig
from fleet.controllers.shard import (
    GROUP_LABEL,
    ShardMembership,
    assignment,
    shard_lease_name,
    shard_of,
)
from fleet.kube import KubeClient
from fleet.kube.client import KubeObject
from fleet.kube.resources import CONFIGMAPS, LEASES, Resource
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.coordinator import RolloutCoordinator
from fleet.rollout.gate import FleetControls, FleetView
from fleet.rollout.progress import ClusterProgress
from fleet.rollout.state import RolloutState
from fleet.world.model import ClusterKey
from tests.helpers.gate import T0, cluster

pytestmark = pytest.mark.anyio

LEASE = 6  # seconds: renew every 2 s, stop acting 4 s after the last good renewal started
SHARDS = 12
GROUP = "sharded"


class Replicas:
    """Memberships started in this process, each in its own cancel scope ("kill")."""

    def __init__(self, mgmt: KubeClient, namespace: str, tg: anyio.abc.TaskGroup) -> None:
        self.mgmt, self.namespace, self.tg = mgmt, namespace, tg
        self.members: dict[str, ShardMembership] = {}
        self.scopes: dict[str, anyio.CancelScope] = {}
        self.ended: dict[str, anyio.Event] = {}
        self.overlaps: list[tuple[float, int, list[str]]] = []
        self.first_acting: dict[tuple[str, int], float] = {}

    async def start(self, identity: str,
                    busy: Callable[[], set[ClusterKey]] = set, **kw: Any) -> ShardMembership:
        m = ShardMembership(self.mgmt, namespace=self.namespace, identity=identity,
                            group=GROUP, shards=SHARDS, lease_seconds=LEASE, busy=busy, **kw)
        scope = anyio.CancelScope()
        self.members[identity], self.scopes[identity] = m, scope
        ended = self.ended[identity] = anyio.Event()

        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            try:
                with scope:
                    await m.run(task_status=task_status)
            finally:
                ended.set()  # its renewal thread has stopped too

        await self.tg.start(run)
        return m

    def kill(self, identity: str) -> None:
        """Like SIGKILL: stop at once, give nothing back."""
        self.scopes[identity].cancel()
        del self.members[identity]

    async def sample(self) -> None:
        while True:
            self.sample_once()
            await anyio.sleep(0.02)

    def sample_once(self) -> None:
        now = time.monotonic()
        acting: dict[int, list[str]] = {}
        for name, m in self.members.items():
            for s in m.acting_shards():
                acting.setdefault(s, []).append(name)
                self.first_acting.setdefault((name, s), now)
        self.overlaps += [(now, s, who) for s, who in acting.items() if len(who) > 1]

    def acting(self) -> dict[int, str]:
        return {s: name for name, m in self.members.items() for s in m.acting_shards()}

    async def settled(self, timeout: float) -> dict[int, str]:
        """Wait until every shard is acted on by its rendezvous owner among the running."""
        want = assignment(SHARDS, sorted(self.members))
        with anyio.fail_after(timeout):
            while self.acting() != want:
                await anyio.sleep(0.1)
        # What was just seen acting is recorded even if the sampler has not turned since
        # (on a loaded machine it may not have: a KeyError on first_acting in a full suite).
        self.sample_once()
        return want


async def claims(mgmt: KubeClient, namespace: str) -> dict[int, str]:
    leases = (await mgmt.list(LEASES, namespace, label_selector=f"{GROUP_LABEL}={GROUP}")).items
    out = {}
    for s in range(SHARDS):
        found = [x for x in leases if x["metadata"]["name"] == shard_lease_name(GROUP, s)]
        if found:
            out[s] = found[0]["spec"].get("holderIdentity") or ""
    return out


def _shards_of(owners: dict[int, str], who: str) -> Iterator[int]:
    return (s for s, o in owners.items() if o == who)


async def test_killed_replica_shards_move_only_after_it_must_have_stopped(
        mgmt: KubeClient, namespace: str) -> None:
    async with anyio.create_task_group() as tg:
        r = Replicas(mgmt, namespace, tg)
        tg.start_soon(r.sample)
        for name in ("ctl-a", "ctl-b", "ctl-c"):
            await r.start(name)
        # Newcomers count each other's claims as live for a whole lease before taking
        # any: generous deadline on this shared machine.
        owners = await r.settled(timeout=60)
        assert await claims(mgmt, namespace) == owners
        victim = owners[0]
        theirs = set(_shards_of(owners, victim))
        dead = r.members[victim]
        r.kill(victim)
        killed_at = time.monotonic()
        await r.ended[victim].wait()
        last_renewal = dead.renewed_at  # its last one: its renewal thread has ended
        assert last_renewal is not None
        r.first_acting.clear()  # from here on: who starts acting on what, when
        after = await r.settled(timeout=LEASE + 30)
        resumed = time.monotonic() - killed_at
        tg.cancel_scope.cancel()
    assert r.overlaps == [], r.overlaps[:5]
    assert set(after.values()) == {"ctl-a", "ctl-b", "ctl-c"} - {victim}
    # Only the victim's shards moved, and none before the victim's renew deadline + the
    # margin had passed since its last good renewal started (had it lived on, cut off
    # from the API server, it would have stopped acting at the renew deadline, 2/3 of a
    # lease after that instant: its write fence).
    assert {s for s in range(SHARDS) if owners[s] != after[s]} == theirs
    expiry = r.members[after[next(iter(theirs))]].expiry
    assert expiry == pytest.approx(LEASE * 2 / 3 + LEASE / 10)
    for s in theirs:
        taken = r.first_acting[(after[s], s)]
        assert taken - last_renewal >= expiry, (s, taken - last_renewal)
    assert resumed < LEASE + LEASE / 3 + 10, resumed  # a lease + one round + slack
    assert await claims(mgmt, namespace) == after


async def test_graceful_leave_and_join_hand_shards_over_without_overlap(
        mgmt: KubeClient, namespace: str) -> None:
    busy: set[ClusterKey] = set()
    async with anyio.create_task_group() as tg:
        r = Replicas(mgmt, namespace, tg)
        tg.start_soon(r.sample)
        a = await r.start("ctl-a", busy=lambda: set(busy))
        await r.start("ctl-b")
        owners = await r.settled(timeout=60)
        # ctl-a has an action in flight on a cluster of one of its shards: when ctl-c
        # joins and wins that shard, ctl-a stops starting there but gives it back only
        # once the action is done.
        will_move = assignment(SHARDS, ["ctl-a", "ctl-b", "ctl-c"])
        moving = sorted(s for s in _shards_of(owners, "ctl-a") if will_move[s] == "ctl-c")
        assert moving, (owners, will_move)
        key = next(k for k in ((namespace, f"c{i}") for i in range(10_000))
                   if shard_of(k, SHARDS) == moving[0])
        busy.add(key)
        await r.start("ctl-c")
        with anyio.fail_after(60):
            while moving[0] not in a.releasing:
                await anyio.sleep(0.05)
        assert not a.acts_on(key)
        await anyio.sleep(LEASE)  # several rounds: still held while busy
        assert (await claims(mgmt, namespace))[moving[0]] == "ctl-a"
        busy.clear()
        await r.settled(timeout=60)
        # A replica that leaves gives everything back at once: no lease to wait out.
        b = r.members.pop("ctl-b")
        r.scopes["ctl-b"].cancel()
        await b.release_all()
        left = time.monotonic()
        await r.settled(timeout=60)
        handed = time.monotonic() - left
        tg.cancel_scope.cancel()
    assert r.overlaps == [], r.overlaps[:5]
    assert handed < LEASE, handed


async def test_two_replicas_cannot_both_admit_from_one_record(
        mgmt: KubeClient, namespace: str) -> None:
    """maxConcurrentClusters 1, two replicas each with one queued cluster of their own.
    Both read the same rollout record; the first one's admission is written; the
    second one's write carries the resourceVersion it read, gets a real 409, re-reads,
    finds the record moved and withdraws its admission. Its next decision, from the new
    record, admits nothing."""
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace},
                                      "rollout": {"maxConcurrentClusters": 1}})
    mine_a = [cluster("c0"), dataclasses.replace(cluster("c1"), foreign=True)]
    mine_b = [dataclasses.replace(cluster("c0"), foreign=True), cluster("c1")]
    a, b = RolloutCoordinator(mgmt, cfg), RolloutCoordinator(mgmt, cfg)
    controls, state = await b.read()  # b decides from this record ...
    da = await a.decide(mine_a, T0)  # ... while a admits its cluster first
    assert da.admitted_now == {("fleet", "c0")}
    stale = b.gate.evaluate(FleetView(mine_b, controls, state), T0)
    assert stale.admitted_now == {("fleet", "c1")}  # alone, b would admit c1 too
    assert not await b.write(stale)  # 409, re-read: the record moved; nothing written
    cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
    assert RolloutState.from_json(cm["data"][STATE_KEY]).admitted.keys() == {"fleet/c0"}
    db = await b.decide(mine_b, T0)
    assert db.admitted_now == frozenset() and db.allowed_clusters == frozenset()


async def test_an_admission_lost_to_another_replica_keeps_the_held_reason(
        mgmt: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #13 target 2: b's cluster c1 is held for a slot while a's c0 upgrades. c0
    completes; b decides from the record as it read it before a dropped c0's admission
    (a trailing copy), admits c1, and its write gets a real 409 and finds the record
    moved. c1 stays held with the reason it had (its MD and KCP status are not rewritten
    to "not yet recorded" and back for one round trip), and b's next decision, from the
    record as it is, admits it."""
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace},
                                      "rollout": {"maxConcurrentClusters": 1}})
    a, b = RolloutCoordinator(mgmt, cfg), RolloutCoordinator(mgmt, cfg)

    def mine(owner: str, c0: str) -> list[ClusterProgress]:
        cs = [cluster("c0", c0), cluster("c1")]
        return [dataclasses.replace(c, foreign=(c.name != owner)) for c in cs]

    da = await a.decide(mine("c0", "ww"), T0)
    assert da.admitted_now == {("fleet", "c0")}
    held = await b.decide(mine("c1", "ww"), T0)
    reason = held.reasons[("fleet", "c1")]
    assert "maxConcurrentClusters 1" in reason
    trailing = await b.read()  # c0 still admitted in it
    await a.decide(mine("c0", "uu"), T0)  # c0 complete: a drops its admission
    cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
    assert RolloutState.from_json(cm["data"][STATE_KEY]).admitted.keys() == set()

    async def stale_read() -> tuple[FleetControls, RolloutState]:
        return trailing

    with monkeypatch.context() as m:
        m.setattr(b, "read", stale_read)
        lost = await b.decide(mine("c1", "uu"), T0)
    assert b.raced
    assert ("fleet", "c1") not in lost.allowed_clusters
    assert lost.reasons[("fleet", "c1")] == reason
    admitted = await b.decide(mine("c1", "uu"), T0)
    assert admitted.admitted_now == {("fleet", "c1")}


class ClaimWrites:
    """The real client (every request goes to the API server), counting how many claim
    writes (Lease create or replace) are in flight at once."""

    def __init__(self, real: KubeClient) -> None:
        self.real = real
        self.in_flight = self.most_at_once = self.sent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def _counted(self, call: Awaitable[KubeObject]) -> KubeObject:
        self.sent += 1
        self.in_flight += 1
        self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            return await call
        finally:
            self.in_flight -= 1

    async def create(self, res: Resource, body: KubeObject,
                     namespace: str | None = None) -> KubeObject:
        return await self._counted(self.real.create(res, body, namespace))

    async def replace(self, res: Resource, body: KubeObject, *,
                      subresource: str | None = None) -> KubeObject:
        return await self._counted(self.real.replace(res, body, subresource=subresource))


async def test_a_replica_sends_the_claims_of_one_look_at_once(
        mgmt: KubeClient, namespace: str) -> None:
    """A replica alone takes every shard in its first look, with the claims' writes in
    flight together (one after the other, a taker of several shards on a loaded API server
    waited seconds for its last claim, and its warm-up for all of them)."""
    writes = ClaimWrites(mgmt)
    async with anyio.create_task_group() as tg:
        r = Replicas(writes, namespace, tg)  # type: ignore[arg-type]
        await r.start("solo")
        assert await r.settled(timeout=30) == dict.fromkeys(range(SHARDS), "solo")
        tg.cancel_scope.cancel()
    assert await claims(mgmt, namespace) == dict.fromkeys(range(SHARDS), "solo")
    assert writes.sent >= SHARDS
    assert writes.most_at_once == SHARDS, writes.most_at_once


async def test_a_replica_reads_ahead_what_it_will_take_from_one_that_missed_a_renewal(
        mgmt: KubeClient, namespace: str) -> None:
    """Killed, a replica stops renewing; once one renewal is missed (1.5 periods after
    the last one seen: a check of what the Lease watch showed, no request) the survivor
    reads ahead exactly the shards it will take, while the dead one still holds their
    claims and nothing there is acted on; the take follows at the expiry, not sooner.
    (Margin 2 s: 3 s between the two instants on this shared machine.)"""
    reads: list[tuple[float, frozenset[int], dict[int, str], set[int]]] = []
    async with anyio.create_task_group() as tg:
        r = Replicas(mgmt, namespace, tg)
        tg.start_soon(r.sample)
        a = await r.start("ctl-a", handoff_margin=2.0)
        await r.start("ctl-b", handoff_margin=2.0)
        owners = await r.settled(timeout=60)
        theirs = set(_shards_of(owners, "ctl-b"))

        async def read_ahead() -> None:
            reads.append((time.monotonic(), frozenset(a.readying),
                          await claims(mgmt, namespace), a.acting_shards()))

        a.read_ahead = read_ahead
        r.kill("ctl-b")
        await r.ended["ctl-b"].wait()
        r.first_acting.clear()
        after = await r.settled(timeout=LEASE + 30)
        tg.cancel_scope.cancel()
    assert r.overlaps == [], r.overlaps[:5]
    assert set(after.values()) == {"ctl-a"}
    assert reads, "no read-ahead before the take"
    at, readying, held, acting = reads[0]
    assert readying == theirs
    assert {s: held[s] for s in theirs} == {s: "ctl-b" for s in theirs}, \
        "read ahead while the dead replica still held the claims"
    assert not acting & theirs
    assert all(r.first_acting[("ctl-a", s)] > at for s in theirs)
