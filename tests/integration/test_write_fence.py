"""Every writer is fenced by its Lease (the chaos suite's leader-pause fault: a
controller SIGSTOPped past its Lease and resumed sent one more status patch after the
other replica had taken over, before its renewal task had run).

Against the real kube-apiserver: a fenced client sends no write while its holder does not
hold (reads still work), and the elector stops holding as soon as its last renewal is
older than the renew deadline on its own clock, before its renewal task has run again.
Sharded replicas: a write for a cluster needs the member Lease fresh on the replica's own
clock and the cluster's shard held; a fleet-wide one also the writer Lease. The Event
recorder and the rollout policy write through the same fenced client.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import anyio
import pytest

from fleet.config.models import FleetConfig
from fleet.controllers.leader import LeaderElector
from fleet.controllers.shard import (
    LostMembershipError,
    ShardMembership,
    assignment,
    shard_of,
)
from fleet.events import EventRecorder, Regarding, list_events
from fleet.kube import FencedError, KubeClient, NotFoundError
from fleet.kube.resources import CONFIGMAPS
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.coordinator import RolloutCoordinator
from fleet.rollout.policy import RolloutPolicy
from fleet.rollout.state import RolloutState
from fleet.testing.proxy import StallingProxy
from fleet.testing.world import World
from fleet.world.fence import WriteFence, fleet_wide_writes, writes_for
from fleet.world.model import ClusterKey, Snapshot
from tests.helpers.gate import T0, cluster
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio


async def test_a_fenced_client_sends_no_write_while_the_lease_is_not_held(
        mgmt: KubeClient, namespace: str) -> None:
    holding = False
    fenced = mgmt.fenced(lambda: holding)
    name = unique("fenced")
    body = {"metadata": {"name": name, "namespace": namespace}, "data": {"k": "v"}}
    with pytest.raises(FencedError, match="not sent"):
        await fenced.create(CONFIGMAPS, body, namespace)
    with pytest.raises(NotFoundError):  # not sent: reads go through
        await fenced.get(CONFIGMAPS, name, namespace)
    holding = True
    await fenced.create(CONFIGMAPS, body, namespace)
    holding = False
    with pytest.raises(FencedError):
        await fenced.patch(CONFIGMAPS, name, {"data": {"k": "w"}}, namespace)
    assert (await mgmt.get(CONFIGMAPS, name, namespace))["data"] == {"k": "v"}


async def test_the_elector_stops_holding_once_its_renewal_is_overdue_on_its_clock(
        mgmt: KubeClient, namespace: str) -> None:
    """A process stopped past its renew deadline: its monotonic clock jumps; ``holds()``
    is false at once, while ``leading`` (the renewal task has not run yet) is still set."""
    offset = 0.0

    def clock() -> float:
        import time  # noqa: PLC0415

        return time.monotonic() + offset

    elector = LeaderElector(mgmt, namespace=namespace, identity="a", name=unique("lease"),
                            lease_seconds=30, monotonic=clock)
    seen: dict[str, bool] = {}

    async def lead() -> None:
        nonlocal offset
        seen["holds while leading"] = elector.holds()
        offset = elector.renew_deadline + 1  # as if stopped that long, just now resumed
        seen["leading after the jump"] = elector.leading
        seen["holds after the jump"] = elector.holds()

    assert not elector.holds()
    with anyio.fail_after(60):
        await elector.run(lead)
    assert seen == {"holds while leading": True, "leading after the jump": True,
                    "holds after the jump": False}
    assert not elector.holds()


# -- sharded replicas ------------------------------------------------------------------

SHARD_LEASE = 6  # seconds: renew every 2 s, stop acting 4 s after the last good renewal
SHARDS = 4


def _cluster_in(shards: set[int], namespace: str) -> ClusterKey:
    return next(k for k in ((namespace, f"c{i}") for i in range(10_000))
                if shard_of(k, SHARDS) in shards)


def _member(client: KubeClient, namespace: str, identity: str, group: str,
            monotonic: Callable[[], float] = time.monotonic) -> ShardMembership:
    return ShardMembership(client, namespace=namespace, identity=identity, group=group,
                           shards=SHARDS, lease_seconds=SHARD_LEASE, monotonic=monotonic)


async def _until(what: Callable[[], bool], timeout: float = 60) -> None:
    with anyio.fail_after(timeout):
        while not what():
            await anyio.sleep(0.05)


async def test_a_sharded_replica_resumed_after_its_shards_moved_sends_no_write(
        world: World, mgmt: KubeClient, namespace: str) -> None:
    """ctl-a holds every shard and is then stopped (its Lease traffic stalled, its clock
    frozen: none of its tasks gets anything done, as under SIGSTOP) until ctl-b has taken
    its shards. Resumed, ctl-a still believes it acts on them (``acts_on`` is true: its
    renewal task has not run yet), so an action that had passed that check would write;
    its fenced client sends nothing."""
    group = unique("sh")
    frozen_at: float | None = None

    def clock_a() -> float:
        return time.monotonic() if frozen_at is None else frozen_at

    server = world["mgmt"]
    async with StallingProxy(server.port) as proxy:
        config = server.kubeconfig()
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        async with await KubeClient.from_kubeconfig(config, name="ctl-a") as a_leases, \
                anyio.create_task_group() as tg:
            a = _member(a_leases, namespace, "ctl-a", group, clock_a)
            a_writes = mgmt.fenced(a.write_fence(lambda: True))

            async def run_a() -> None:
                with contextlib.suppress(LostMembershipError):
                    await a.run()

            tg.start_soon(run_a)
            await _until(lambda: a.acting_shards() == set(range(SHARDS)))
            key = _cluster_in({0}, namespace)
            name = unique("written")
            with writes_for(key):  # holding: sent
                await a_writes.create(CONFIGMAPS, {"metadata": {"name": name},
                                                   "data": {"by": "ctl-a"}}, namespace)
            frozen_at = time.monotonic()  # stopped from here on
            proxy.stall()
            b = _member(mgmt, namespace, "ctl-b", group)
            tg.start_soon(b.run)
            # ctl-b takes the shards once ctl-a's member Lease has stood still for a lease
            await _until(lambda: b.acting_shards() == set(range(SHARDS)),
                         timeout=SHARD_LEASE + 60)
            frozen_at = None  # resumed: its clock shows the time it was stopped for
            acted = a.acts_on(key)  # what its actions checked before they were stopped
            with writes_for(key), pytest.raises(FencedError):
                await a_writes.patch(CONFIGMAPS, name, {"data": {"by": "ctl-a again"}},
                                     namespace)
            proxy.resume()
            tg.cancel_scope.cancel()
    assert acted, "ctl-a did not still believe it acted: the case the fence is for"
    assert (await mgmt.get(CONFIGMAPS, name, namespace))["data"] == {"by": "ctl-a"}


async def test_a_sharded_replica_writes_only_for_the_clusters_of_its_shards(
        mgmt: KubeClient, namespace: str) -> None:
    """Two live replicas: each one's fenced client writes for the clusters of the shards
    it holds, not for the other's (its last look at the claims); a write for no cluster
    needs only its member Lease; a fleet-wide one also the writer Lease."""
    group = unique("sh")
    writer_holds = False
    async with anyio.create_task_group() as tg:
        a = _member(mgmt, namespace, "ctl-a", group)
        await tg.start(a.run)
        await _until(lambda: a.acting_shards() == set(range(SHARDS)))
        b = _member(mgmt, namespace, "ctl-b", group)
        await tg.start(b.run)
        want = assignment(SHARDS, ["ctl-a", "ctl-b"])
        assert set(want.values()) == {"ctl-a", "ctl-b"}, want
        a_owns = {s for s, owner in want.items() if owner == "ctl-a"}
        await _until(lambda: a.acting_shards() == a_owns and not a.held - a_owns
                     and b.acting_shards() == set(range(SHARDS)) - a_owns,
                     timeout=SHARD_LEASE + 60)
        mine = _cluster_in(a.acting_shards(), namespace)
        theirs = _cluster_in(b.acting_shards(), namespace)
        a_writes = mgmt.fenced(a.write_fence(lambda: writer_holds))

        async def write(cluster: ClusterKey | None, *, fleet: bool = False) -> str:
            name = unique("w")
            with writes_for(cluster), fleet_wide_writes(fleet):
                try:
                    await a_writes.create(CONFIGMAPS, {"metadata": {"name": name}},
                                          namespace)
                except FencedError:
                    return "fenced"
            await mgmt.get(CONFIGMAPS, name, namespace)
            return "sent"

        outcomes = {"mine": await write(mine), "theirs": await write(theirs),
                    "no cluster": await write(None),
                    "fleet-wide, not the writer": await write(None, fleet=True)}
        writer_holds = True
        outcomes["fleet-wide, the writer"] = await write(None, fleet=True)
        tg.cancel_scope.cancel()
    assert outcomes == {"mine": "sent", "theirs": "fenced", "no cluster": "sent",
                        "fleet-wide, not the writer": "fenced",
                        "fleet-wide, the writer": "sent"}


# -- the Event recorder and the rollout policy ------------------------------------------


async def test_events_and_the_rollout_record_are_not_sent_by_a_resumed_leader(
        mgmt: KubeClient, namespace: str) -> None:
    """The leader's Event recorder and rollout coordinator write through its fenced
    client: once its renewal is overdue on its clock (a stop past the Lease, then
    resumed), neither an Event nor an admission in the rollout record is sent."""
    offset = 0.0

    def clock() -> float:
        return time.monotonic() + offset

    elector = LeaderElector(mgmt, namespace=namespace, identity="a", name=unique("lease"),
                            lease_seconds=30, monotonic=clock)
    writes = mgmt.fenced(elector.holds)
    recorder = EventRecorder(writes, instance="a", default_namespace=namespace)
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace},
                                      "rollout": {"maxConcurrentClusters": 1}})
    coordinator = RolloutCoordinator(writes, cfg, recorder=recorder)
    seen: dict[str, object] = {}

    async def lead() -> None:
        nonlocal offset
        seen["event while holding"] = await recorder.emit(
            Regarding("ConfigMap", "x", namespace), reason="Held", action="Test", note="sent")
        seen["admitted while holding"] = sorted(
            (await coordinator.decide([cluster("c0", namespace=namespace)], T0)).admitted_now)
        offset = elector.renew_deadline + 1  # as if stopped that long, just now resumed
        seen["event after the jump"] = await recorder.emit(
            Regarding("ConfigMap", "x", namespace), reason="Resumed", action="Test",
            note="not sent")
        seen["admitted after the jump"] = sorted(
            (await coordinator.decide([cluster("c0", "u", namespace=namespace),
                                       cluster("c1", namespace=namespace)], T0)).admitted_now)

    with anyio.fail_after(60):
        await elector.run(lead)
    assert seen == {"event while holding": True,
                    "admitted while holding": [(namespace, "c0")],
                    "event after the jump": False, "admitted after the jump": []}
    reasons = {e["reason"] for e in await list_events(mgmt, namespace)}
    assert "Resumed" not in reasons and "UpgradeAdmitted" in reasons, reasons
    cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
    assert RolloutState.from_json(cm["data"][STATE_KEY]).admitted.keys() == {f"{namespace}/c0"}


async def test_the_rollout_policy_marks_its_fleet_wide_writes(
        mgmt: KubeClient, namespace: str) -> None:
    """Sharded: a replica that decided as the fleet-wide writer sends the rollout record
    only while the writer Lease holds (the fence's fleet-wide check); a replica that is
    not the writer writes its own admissions under its member Lease alone."""
    cfg = FleetConfig.model_validate({"management": {"namespace": namespace}})
    group = unique("sh")
    writer_holds = False
    async with anyio.create_task_group() as tg:
        a = _member(mgmt, namespace, "ctl-a", group)
        await tg.start(a.run)
        writes = mgmt.fenced(a.write_fence(lambda: writer_holds))
        recorder = EventRecorder(writes, instance="ctl-a", default_namespace=namespace)
        as_writer = RolloutPolicy(writes, cfg, recorder=recorder, fleet_writer=lambda: True)
        await as_writer(Snapshot(now=T0))  # the writer Lease was lost since: fenced
        first = await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
        not_writer = RolloutPolicy(writes, cfg, recorder=recorder, fleet_writer=lambda: False)
        await not_writer(Snapshot(now=T0))
        second = await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
        tg.cancel_scope.cancel()
    assert first is None  # the record's creation was not sent
    assert second is not None


async def test_a_write_stuck_past_the_lease_is_given_up_when_the_lease_runs_out(
        world: World, namespace: str) -> None:
    """Issue #30: the fence used to be asked once, before a send that could then wait for
    a connection, a connect and retries for as long as its timeout (30 s), so the caller
    went on as the Lease's holder long after the Lease had passed to another replica. The
    whole send is now bounded by the time the Lease is still known to be held: against a
    stalled API server, a leader's write with 1.5 s of Lease left is given up
    (FencedError) in about that time, and the next write is not sent at all. (Bytes that
    had left before the deadline may still be applied late: only a fencing token checked
    by the API server could refuse those; docs/reliability.md.)"""
    server = world["mgmt"]
    async with StallingProxy(server.port) as proxy:
        config = server.kubeconfig()
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        async with await KubeClient.from_kubeconfig(config, name="stuck") as client:
            await client.get_or_none(CONFIGMAPS, "warm-up", namespace)
            deadline = time.monotonic() + 1.5
            fence = WriteFence(lambda: time.monotonic() < deadline,
                               lambda: deadline - time.monotonic())
            fenced = client.fenced(fence)
            proxy.stall()
            name = unique("late")
            started = time.monotonic()
            with anyio.fail_after(10), pytest.raises(FencedError, match="not answered within"):
                await fenced.create(CONFIGMAPS, {"metadata": {"name": name},
                                                 "data": {"k": "v"}}, namespace)
            assert time.monotonic() - started < 5
            # a fresh fenced write after the deadline is refused before it is sent
            before = proxy.connections
            with pytest.raises(FencedError, match="not sent"):
                await fenced.create(CONFIGMAPS, {"metadata": {"name": unique("never")}},
                                    namespace)
            assert proxy.connections == before  # not even a connection was opened
            proxy.resume()

