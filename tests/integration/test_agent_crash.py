"""Crash matrix: SIGKILL the agent at every step boundary, restart it, demand convergence.

The agent kills itself at a named point when K0S_FLEET_AGENT_CRASH_AT says so (a
test-only hook, unset in production). ``<State>:before`` is right after the state was
recorded, before its work; ``<State>:after`` is after the work, before the next state
is recorded. ``ApplyingUpdate:after`` is k0s issue 7703's window (binary renamed,
status not written); ``Restarting:after`` is between the restart and its record;
``Restarting:marked`` is between the durable restart intent and the restart itself.
Cases run concurrently, each on its own simulated node.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.agents.files import sha256_file
from fleet.contract.signal import CORDONED_BY_KEY, HAPPY_PATH, SignalState
from fleet.kube import KubeClient, KubeObject
from fleet.testing.releases import Release, ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World

pytestmark = pytest.mark.anyio

OLD = "v1.31.3+k0s.0"
NEW = "v1.32.1+k0s.0"
BROKEN = "v1.32.2+k0s.0"
ONCE_STALLED = "v1.32.5+k0s.0"
TERMINAL = {s for s in SignalState if s.terminal}

UPGRADE_POINTS = [
    *(f"{s}:{w}" for s in HAPPY_PATH[:-1] for w in ("before", "after")),
    "Restarting:marked",
    "Completed:after",
]
ROLLBACK_POINTS = [
    "rollback:marked",
    "rollback-restart:marked",
    "rollback:restarted",
    "RolledBack:after",
]


@pytest.fixture(scope="module")
async def releases() -> AsyncIterator[ReleaseServer]:
    async with ReleaseServer() as rs:
        rs.add(OLD)
        rs.add(NEW, size=4 * 1024 * 1024)
        rs.add(BROKEN, broken=True)
        rs.add(ONCE_STALLED, size=4 * 1024 * 1024)
        yield rs


def uncordoned(obj: KubeObject) -> bool:
    return not (obj.get("spec") or {}).get("unschedulable") and \
        CORDONED_BY_KEY not in ((obj.get("metadata") or {}).get("annotations") or {})


def leftovers(node: SimNode) -> list[str]:
    files = [p.name for p in node.binary.parent.iterdir() if p.name != "k0s"]
    files += [p.name for p in node.state_dir.iterdir() if p.name != "agent.lock"]
    return sorted(files)


async def converge(node: SimNode, plan: str, target: Release, expect: SignalState,
                   expected_version: str) -> None:
    sig = await node.wait_for(plan, TERMINAL, timeout=90)
    assert sig.status is not None
    assert sig.status.status is expect, f"{sig.status.status}: {sig.status.reason}"
    assert await node.running_version() == expected_version
    assert sha256_file(node.binary) == target.sha256
    # Generous: after a crash at a terminal state, cleaning up is the restarted agent's
    # first act, and 18 agents restarting at once on 2 cores can take a while to start.
    await node.wait_until(uncordoned, timeout=60)
    with anyio.fail_after(60):
        while leftovers(node):
            await anyio.sleep(0.05)


async def crash_case(client: KubeClient, kubeconfig: dict[str, Any], root: Path,
                     rs: ReleaseServer, point: str) -> None:
    rollback = point in ROLLBACK_POINTS
    request = rs.releases[BROKEN if rollback else NEW]
    async with SimNode.running(client, kubeconfig, root, rs.releases[OLD], crash_at=point,
                               agent_args=["--verify-timeout", "4"] if rollback else []
                               ) as node:
        try:
            plan = await node.request(request)
            rc = await node.wait_agent_exit(timeout=60)
            assert rc == -signal.SIGKILL, f"agent exited {rc}: crash point never reached?"
            assert f"crash point {point} reached" in node.log_text()
            await node.start_agent(extra_args=node.agent_args)
            if rollback:
                await converge(node, plan, rs.releases[OLD], SignalState.ROLLED_BACK, OLD)
                states = node.states(plan)
                assert states[:5] == [str(s) for s in HAPPY_PATH[:5]], states
                assert states[-1] == "RolledBack", states
                # one for the upgrade, at most one for the rollback (none is needed when
                # the crash-looping new k0s is down: the init system starts the old one)
                issued = node.log_text().count("fleet.agents.restart: restart: ")
                assert issued in (1, 2), f"{issued} restarts issued"
            else:
                await converge(node, plan, request, SignalState.COMPLETED, NEW)
                # no transition lost, none repeated
                assert node.states(plan) == [str(s) for s in HAPPY_PATH], node.states(plan)
                assert node.restarts == 1, f"k0s restarted {node.restarts} times"
            assert node.agent_runs == 2
        except Exception as e:
            tail = node.log_text()[-3000:]
            raise AssertionError(f"crash point {point}: {leaves(e)}\n--- agent log ---\n{tail}"
                                 ) from e


def leaves(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(leaves(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"


async def test_crash_matrix(wl1: KubeClient, crds_installed: World, releases: ReleaseServer,
                            tmp_path: Path) -> None:
    kubeconfig = crds_installed["wl1"].kubeconfig()
    points = UPGRADE_POINTS + ROLLBACK_POINTS
    failures: dict[str, str] = {}

    async def one(i: int, point: str) -> None:
        try:
            await crash_case(wl1, kubeconfig, tmp_path / f"c{i}", releases, point)
        except Exception as e:
            failures[point] = leaves(e)

    t0 = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for i, point in enumerate(points):
            tg.start_soon(one, i, point)
    print(f"\ncrash matrix: {len(points)} cases in {anyio.current_time() - t0:.1f}s")
    assert not failures, "\n\n".join(failures.values())


async def test_killed_mid_transfer(wl1: KubeClient, crds_installed: World,
                                   releases: ReleaseServer, tmp_path: Path) -> None:
    """SIGKILL while bytes are flowing: the partial file is discarded, the next run
    downloads again and completes."""
    releases.fail(ONCE_STALLED, "stall", times=1)
    rel = releases.releases[ONCE_STALLED]
    async with SimNode.running(wl1, crds_installed["wl1"].kubeconfig(), tmp_path,
                               releases.releases[OLD],
                               agent_args=["--download-stall-timeout", "60"]) as node:
        plan = await node.request(rel)
        await node.wait_for(plan, {SignalState.DOWNLOADING})
        part = node.binary.with_name(".k0s.fleet-part")
        with anyio.fail_after(20):
            while not part.exists() or part.stat().st_size == 0:
                await anyio.sleep(0.05)
        assert node.agent is not None
        node.agent.kill()
        await node.wait_agent_exit()
        await node.start_agent()
        await converge(node, plan, rel, SignalState.COMPLETED, ONCE_STALLED)
        assert node.states(plan) == [str(s) for s in HAPPY_PATH]
        assert releases.requests[ONCE_STALLED] == 2 and node.restarts == 1
