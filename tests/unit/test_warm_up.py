"""A taken shard's warm-up (fleet.controllers.shard.ShardMembership._warm_up) runs on a
task of its own, to its end: it is not cut off by a look at the claims, and it makes warm
only the takes it read for.

The membership is never run against a server: its state is set as a look would set it.
"""

from __future__ import annotations

import anyio
import pytest

from fleet.controllers.renewal import Wake
from fleet.controllers.shard import ShardMembership
from fleet.kube import KubeClient

pytestmark = pytest.mark.anyio


class SlowWarm:
    """A warm-up whose calls each end only when the test lets them."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self) -> bool:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        self.release = anyio.Event()
        self.started = anyio.Event()
        return True


def _membership(warm: SlowWarm) -> ShardMembership:
    client = KubeClient.__new__(KubeClient)
    m = ShardMembership(client, namespace="ns", identity="ctl-a", shards=8, lease_seconds=3,
                        warm=warm)
    m.active = True
    return m


async def _until(what: str, cond: object) -> None:
    with anyio.fail_after(5):
        while not cond():  # type: ignore[operator]
            await anyio.sleep(0.001)


async def test_a_warm_up_longer_than_a_look_runs_to_its_end_and_warms_what_it_read() -> None:
    warm = SlowWarm()
    m = _membership(warm)
    async with anyio.create_task_group() as tg:
        wake = m._warm_wake = Wake()
        tg.start_soon(m._warm_up, wake)
        m._start_warming(1)
        await warm.started.wait()
        # Longer than a look (renew_every = 1 s here): the call is still the first one.
        await anyio.sleep(m.renew_every * 1.5)
        assert warm.calls == 1 and m.warming == {1} and m.acting_shards() == set()
        m._start_warming(2)  # taken while the first warm-up reads
        warm.release.set()
        await _until("shard 1 warm", lambda: 1 not in m.warming)
        assert m.acting_shards() == {1}
        assert m.warming == {2}  # not read by the call that ended: a call of its own
        await warm.started.wait()
        assert warm.calls == 2
        warm.release.set()
        await _until("shard 2 warm", lambda: not m.warming)
        assert m.acting_shards() == {1, 2}
        tg.cancel_scope.cancel()


async def test_a_shard_given_back_and_taken_again_during_a_warm_up_is_read_once_more(
        ) -> None:
    warm = SlowWarm()
    m = _membership(warm)
    async with anyio.create_task_group() as tg:
        wake = m._warm_wake = Wake()
        tg.start_soon(m._warm_up, wake)
        m._start_warming(3)
        await warm.started.wait()
        # Given back (as a look does), then taken again, while the first call reads.
        m.held.discard(3)
        m.warming.discard(3)
        m._start_warming(3)
        warm.release.set()
        await warm.started.wait()  # a second call: the first one read the earlier take
        assert warm.calls == 2 and m.warming == {3} and m.acting_shards() == set()
        warm.release.set()
        await _until("shard 3 warm", lambda: not m.warming)
        assert m.acting_shards() == {3}
        tg.cancel_scope.cancel()


async def test_a_failed_warm_up_is_tried_again_and_acts_on_nothing_meanwhile() -> None:
    results = [False, True]
    calls: list[bool] = []

    async def warm() -> bool:
        calls.append(results[len(calls)])
        return calls[-1]

    m = ShardMembership(KubeClient.__new__(KubeClient), namespace="ns", identity="ctl-a",
                        shards=8, lease_seconds=3, warm=warm)
    m.active = True
    async with anyio.create_task_group() as tg:
        wake = m._warm_wake = Wake()
        tg.start_soon(m._warm_up, wake)
        m._start_warming(4)
        await _until("a first call", lambda: calls)
        assert m.acting_shards() == set()
        await _until("shard 4 warm", lambda: not m.warming)
        assert calls == [False, True] and m.acting_shards() == {4}
        tg.cancel_scope.cancel()
