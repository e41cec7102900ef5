"""Lease renewals a busy event loop cannot starve (fleet.controllers.renewal), on a real
kube-apiserver.

A replica's main event loop is blocked synchronously (``time.sleep`` inside a task, as a
long decode or planning pass on a starved CPU would): for longer than the renew deadline
it keeps its member Lease (renewed from its own thread), nobody takes its shards, and it
acts again afterwards; for longer than the liveness bound its renewals stop and it stops.
The other replica runs on a thread of its own, so the block does not stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from fleet.cli.exit import Exit
from fleet.controllers.leader import LeaderElector
from fleet.controllers.shard import (
    GROUP_LABEL,
    LostMembershipError,
    ShardMembership,
    assignment,
    member_lease_name,
    shard_lease_name,
)
from fleet.kube import KubeClient
from fleet.kube.resources import LEASES
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.world import World
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

LEASE = 6  # seconds: renew every 2 s, stop acting 4 s after the last good renewal started
SHARDS = 4


async def _until(what: Any, timeout: float = 60) -> None:
    with anyio.fail_after(timeout):
        while not what():
            await anyio.sleep(0.05)


async def _claims(mgmt: KubeClient, namespace: str, group: str) -> dict[int, tuple[str, int]]:
    leases = (await mgmt.list(LEASES, namespace,
                              label_selector=f"{GROUP_LABEL}={group}")).items
    by_name = {x["metadata"]["name"]: x["spec"] for x in leases}
    return {s: (by_name[n].get("holderIdentity") or "",
                int(by_name[n].get("leaseTransitions") or 0))
            for s in range(SHARDS) if (n := shard_lease_name(group, s)) in by_name}


class OtherReplica:
    """A ShardMembership on a thread and event loop of its own (another process, as far
    as a block of the test's event loop goes)."""

    def __init__(self, origin: KubeClient, namespace: str, identity: str, group: str) -> None:
        self.origin, self.namespace, self.identity, self.group = \
            origin, namespace, identity, group
        self.member: ShardMembership | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scope: anyio.CancelScope | None = None
        self._thread = threading.Thread(target=lambda: anyio.run(self._main), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        async with await self.origin.reopen(name=self.identity) as client:
            self.member = ShardMembership(client, namespace=self.namespace,
                                          identity=self.identity, group=self.group,
                                          shards=SHARDS, lease_seconds=LEASE)
            with anyio.CancelScope() as self._scope, \
                    contextlib.suppress(LostMembershipError):
                await self.member.run()

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        if self._loop is not None and self._scope is not None:
            self._loop.call_soon_threadsafe(self._scope.cancel)
        await anyio.to_thread.run_sync(self._thread.join, 30)


def _block(seconds: float) -> float:
    """Block the calling event loop (no await) for ``seconds``; returns when it began."""
    began = time.monotonic()
    time.sleep(seconds)
    return began


async def test_a_replica_blocked_past_its_renew_deadline_keeps_its_lease_and_shards(
        mgmt: KubeClient, namespace: str) -> None:
    group = unique("blk")
    a = ShardMembership(mgmt, namespace=namespace, identity="ctl-a", group=group,
                        shards=SHARDS, lease_seconds=LEASE, stall_seconds=4 * LEASE)
    b = OtherReplica(mgmt, namespace, "ctl-b", group)
    want = assignment(SHARDS, ["ctl-a", "ctl-b"])
    a_owns = {s for s, who in want.items() if who == "ctl-a"}
    assert a_owns and a_owns != set(range(SHARDS)), want
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(a.run)
            b.start()
            with anyio.fail_after(LEASE + 90):  # both replicas hold their shares
                while True:
                    before = await _claims(mgmt, namespace, group)
                    if {s: who for s, (who, _) in before.items()} == want and \
                            a.acting_shards() == a_owns and not a.held - a_owns:
                        break
                    await anyio.sleep(0.1)
            # Longer than the renew deadline and than a whole lease: with renewals on the
            # main loop, ctl-a would stop and ctl-b would take its shards.
            began = _block(LEASE + 2)
            assert a.active and a.problem is None
            assert a.renewed_at is not None and a.renewed_at > began + a.renew_every, \
                (a.renewed_at - began)
            assert a.holds()
            after = await _claims(mgmt, namespace, group)
            assert after == before  # no claim moved, none was even written
            assert b.member is not None and b.member.handoffs == 0
            # ... and ctl-a acts again: its rebalancing runs, it keeps acting on its shards.
            await anyio.sleep(2 * a.renew_every)
            assert a.acting_shards() == a_owns and a.holds()
            lease = await mgmt.get(LEASES, member_lease_name(group, "ctl-a"), namespace)
            assert lease["spec"]["holderIdentity"] == "ctl-a"
            tg.cancel_scope.cancel()
    finally:  # outside the cancelled scope (an await in there would raise the
        await b.stop()  # cancellation, which the task group swallows, and hide a failure)


async def test_a_replica_blocked_past_the_liveness_bound_stops_renewing_and_stops(
        mgmt: KubeClient, namespace: str) -> None:
    group = unique("blk")
    stalls: list[tuple[float, str]] = []
    stall_seconds = 2 * LEASE
    a = ShardMembership(mgmt, namespace=namespace, identity="ctl-a", group=group,
                        shards=SHARDS, lease_seconds=LEASE, stall_seconds=stall_seconds,
                        on_stall=lambda why: stalls.append((time.monotonic(), why)))
    b = OtherReplica(mgmt, namespace, "ctl-b", group)
    outcome: list[BaseException] = []
    async def run_a(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            await a.run(task_status=task_status)
        except LostMembershipError as e:
            outcome.append(e)

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(run_a)
            await _until(lambda: a.acting_shards() == set(range(SHARDS)),
                         timeout=LEASE + 60)
            b.start()
            began = _block(stall_seconds + LEASE + 2)
            # Its renewals stopped once the main loop had been silent for the bound: the
            # last good one started before then (plus one renewal period of slack).
            assert stalls, "on_stall was not called"
            assert stalls[0][0] - began >= stall_seconds - 1.5, stalls[0][0] - began
            assert "no sign of life" in stalls[0][1], stalls
            assert a.renewed_at is not None
            assert a.renewed_at - began < stall_seconds + a.renew_every, a.renewed_at - began
            assert not a.active and not a.holds()
            await _until(lambda: bool(outcome), timeout=30)
            assert "no sign of life" in str(outcome[0]), outcome
            # ctl-b takes every shard: ctl-a's member Lease stood still.
            await _until(lambda: b.member is not None and
                         b.member.acting_shards() == set(range(SHARDS)), timeout=LEASE + 60)
            tg.cancel_scope.cancel()
    finally:  # outside the cancelled scope (an await in there would raise the
        await b.stop()  # cancellation, which the task group swallows, and hide a failure)


async def test_a_leader_blocked_past_its_renew_deadline_keeps_leading(
        mgmt: KubeClient, namespace: str) -> None:
    name = unique("lease")
    elector = LeaderElector(mgmt, namespace=namespace, identity="a", name=name,
                            lease_seconds=LEASE)
    seen: dict[str, object] = {}

    async def lead() -> None:
        lease = await mgmt.get(LEASES, name, namespace)
        began = _block(LEASE + 1)
        seen["holds after the block"] = elector.holds()
        seen["leading after the block"] = elector.leading
        await anyio.sleep(elector.renew_every)  # acts on: nothing cancels it
        after = await mgmt.get(LEASES, name, namespace)
        seen["renewed"] = after["spec"]["renewTime"] != lease["spec"]["renewTime"]
        seen["same holder"] = after["spec"]["holderIdentity"] == "a" and \
            after["spec"].get("leaseTransitions") == lease["spec"].get("leaseTransitions")
        seen["blocked"] = time.monotonic() - began >= LEASE + 1

    with anyio.fail_after(90):
        await elector.run(lead)
    assert seen == {"holds after the block": True, "leading after the block": True,
                    "renewed": True, "same holder": True, "blocked": True}


WEDGED = """
import sys, time
import anyio, yaml
from fleet.cli.controller import _exit_unless_stopped_within
from fleet.controllers.shard import ShardMembership
from fleet.kube import KubeClient

async def main() -> None:
    with open(sys.argv[1]) as f:
        client = await KubeClient.from_kubeconfig(yaml.safe_load(f), transport="light")
    m = ShardMembership(client, namespace=sys.argv[2], identity="wedged", group=sys.argv[3],
                        shards=2, lease_seconds=6, stall_seconds=8,
                        on_stall=_exit_unless_stopped_within(6))
    async with anyio.create_task_group() as tg:
        await tg.start(m.run)
        print("member", flush=True)
        time.sleep(600)  # the main loop wedged for good

anyio.run(main)
"""


async def test_a_controller_whose_main_loop_is_wedged_for_good_exits(
        world: World, mgmt: KubeClient, namespace: str, tmp_path: Path) -> None:
    """The controller process's own reaction (fleet.cli.controller): renewals stop once
    the main loop was silent for the bound (8 s), and the process exits (3, "lost its
    Lease") a lease (6 s) later since its main loop never comes back to stop in order."""
    kubeconfig = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    group = unique("wdg")
    log = tmp_path / "wedged.log"
    with log.open("wb") as out:
        proc = await anyio.open_process(
            [sys.executable, "-c", WEDGED, str(kubeconfig), namespace, group],
            stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT),
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        with anyio.fail_after(180):  # starting Python on a loaded machine is slow
            while "member" not in log.read_text():
                assert proc.returncode is None, log.read_text()
                await anyio.sleep(0.2)
            member_at = time.monotonic()
            code = await proc.wait()
        lived = time.monotonic() - member_at
    finally:
        if proc.returncode is None:
            proc.kill()
    text = log.read_text()
    assert code == Exit.LOST_LEADERSHIP, (code, text)
    assert "no sign of life" in text and "exiting in 6s" in text, text
    assert "main event loop still stalled: exiting" in text, text  # the grace ran out
    assert lived >= 6, (lived, text)  # at least the grace (its start seen late at worst)
    lease = await mgmt.get(LEASES, member_lease_name(group, "wedged"), namespace)
    assert lease["spec"]["holderIdentity"] == "wedged"  # a SIGKILL-like end: not released
