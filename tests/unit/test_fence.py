"""The write fences' pure parts (no server): what a write is marked as (fleet.world.fence), and
the sharded replica's fence deciding from its membership's state and its own clock."""

from __future__ import annotations

import inspect
import time

import anyio
import pytest

from fleet.controllers.leader import LeaderElector
from fleet.controllers.shard import ShardMembership, shard_of
from fleet.kube import KubeClient
from fleet.world.fence import fleet_wide, fleet_wide_writes, lease_clock, write_cluster, writes_for
from fleet.world.model import ClusterKey
from tests.helpers.clock import FakeClock

SHARDS = 4


def test_marks_nest_and_are_undone() -> None:
    assert write_cluster() is None and not fleet_wide()
    with writes_for(("ns", "a")):
        assert write_cluster() == ("ns", "a")
        with writes_for(None), fleet_wide_writes():
            assert write_cluster() is None and fleet_wide()
        assert write_cluster() == ("ns", "a") and not fleet_wide()
        with fleet_wide_writes(False):
            assert not fleet_wide()
    assert write_cluster() is None


@pytest.mark.anyio
async def test_a_task_started_inside_keeps_the_mark_and_none_leaks_out() -> None:
    """The dispatcher emits an action's Events in the background: they are still that
    cluster's writes. Concurrent actions do not see each other's cluster."""
    seen: dict[str, ClusterKey | None] = {}
    async with anyio.create_task_group() as background:
        async def action(name: str) -> None:
            with writes_for(("ns", name)):
                await anyio.sleep(0.01)  # the other action runs meanwhile

                async def event() -> None:
                    await anyio.sleep(0.01)
                    seen[f"event of {name}"] = write_cluster()

                background.start_soon(event)
                seen[name] = write_cluster()

        async with anyio.create_task_group() as actions:
            actions.start_soon(action, "a")
            actions.start_soon(action, "b")
    assert seen == {"a": ("ns", "a"), "b": ("ns", "b"), "event of a": ("ns", "a"),
                    "event of b": ("ns", "b")}
    assert write_cluster() is None



def _membership(clock: FakeClock) -> ShardMembership:
    # never run: its state is set as its renewal and rebalancing would
    client = KubeClient.__new__(KubeClient)
    return ShardMembership(client, namespace="ns", identity="ctl-a", shards=SHARDS,
                           lease_seconds=15, monotonic=clock)


def _cluster_in(shard: int) -> ClusterKey:
    return next(k for k in (("ns", f"c{i}") for i in range(10_000))
                if shard_of(k, SHARDS) == shard)


def test_the_shard_fence_needs_a_fresh_member_lease_the_shard_and_for_fleet_wide_the_writer(
        ) -> None:
    clock = FakeClock(100.0)
    m = _membership(clock)
    writer = {"holds": False}
    fence = m.write_fence(lambda: writer["holds"])
    mine, releasing, theirs = _cluster_in(0), _cluster_in(1), _cluster_in(2)

    def verdicts() -> dict[str, bool]:
        out = {}
        for what, cluster, fleet in (("mine", mine, False), ("releasing", releasing, False),
                                     ("theirs", theirs, False), ("none", None, False),
                                     ("fleet-wide", None, True)):
            with writes_for(cluster), fleet_wide_writes(fleet):
                out[what] = fence()
        return out

    assert not any(verdicts().values())  # not a member yet
    m.active, m.renewed_at = True, clock.now
    m.held, m.releasing = {0, 1}, {1}
    assert verdicts() == {"mine": True, "releasing": True, "theirs": False, "none": True,
                          "fleet-wide": False}
    writer["holds"] = True
    assert verdicts()["fleet-wide"]
    clock.now += m.renew_deadline - 0.01
    assert verdicts()["mine"]
    # Resumed after a stop: the renewal is overdue on its clock while ``active`` (cleared
    # by the renewal task, which has not run yet) still says member.
    clock.now += 0.02
    assert m.active and m.acts_on(mine)
    assert not any(verdicts().values())


def test_the_lease_fences_run_on_a_clock_that_counts_suspension() -> None:
    """Issue #30: CLOCK_MONOTONIC stops while the machine is suspended, so a process
    resumed after a suspension past its Lease found its renewal fresh; the fences run on
    CLOCK_BOOTTIME where the system has it."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        assert abs(lease_clock() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1
    for cls in (LeaderElector, ShardMembership):
        assert inspect.signature(cls).parameters["monotonic"].default is lease_clock
