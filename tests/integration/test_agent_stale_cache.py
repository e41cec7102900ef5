"""The agent does not drive again a request it ended, when its cached object lags.

Regression test for commit 8cbc0c7 (``Agent._ended``): the agent's watch can deliver an
older copy of its Node after the agent itself wrote the request's terminal status. Before
the guard, the dispatcher classified that copy as work and started a worker: a second
download after FailedDownload (a second ``agent.Downloading`` span), a second k0s restart
from a stale Restarting copy.

The agent runs in this process against the real kube-apiserver and the simulated node
(real k0s stand-in under a supervisor). It drives the request to its terminal status by
itself (its own watch, its own writes); then, with the agent's loop stopped so nothing
races, the copy its watch delivered earlier is put back as the cached object and the
dispatcher runs once on it: deterministic, no timing involved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from fleet.agents.agent import Agent
from fleet.agents.settings import AgentSettings, RestartStrategy
from fleet.contract.signal import InvalidSignalError, SignalState, parse_signal
from fleet.kube import KubeClient, KubeObject
from fleet.kube.watch import WatchEvent
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from tests.helpers.agent import MANGLED, NEW, TERMINAL

pytestmark = pytest.mark.anyio


class RecordingAgent(Agent):
    """The real agent; keeps every copy of its object its watch delivered."""

    def __init__(self, settings: AgentSettings, client: KubeClient) -> None:
        super().__init__(settings, client)
        self.delivered: list[KubeObject] = []

    async def _on_event(self, event: WatchEvent) -> None:
        if event.type != "DELETED":
            self.delivered.append(event.object)
        await super()._on_event(event)


def settings_for(node: SimNode) -> AgentSettings:
    """What SimNode.agent_command passes to its agent process, as settings."""
    return AgentSettings(
        node_name=node.name, k0s_binary=node.binary, state_dir=node.state_dir,
        status_socket=node.socket, pid_file=node.pid_file,
        restart_strategy=RestartStrategy.SIGNAL, restart_grace=2.0,
        download_attempts=1, download_stall_timeout=2.0, download_backoff_initial=0.1,
        download_backoff_max=0.5, free_space_margin_bytes=0,
        drain_timeout=20.0, verify_timeout=20.0, rollback_timeout=20.0,
        verify_stable_seconds=0.5, allowed_url_prefixes=tuple(node.url_prefixes))


def state_of(obj: KubeObject) -> str | None:
    try:
        sig = parse_signal((obj.get("metadata") or {}).get("annotations") or {})
    except InvalidSignalError:
        return None
    if sig is None:
        return None
    return str(sig.status.status) if sig.status is not None else "(no status)"


async def end_request(agent: RecordingAgent, node: SimNode, plan: str) -> SignalState:
    """Let the agent run until it has ended ``plan`` (status written, worker gone, upgrade
    span recorded); then stop its loop."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.run)
        sig = await node.wait_for(plan, TERMINAL, timeout=90)
        await node.wait_upgrade_recorded()
        with anyio.fail_after(30):
            while agent._worker is not None:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert sig.status is not None
    return sig.status.status


# (release, the status the agent ends the request in, the stale copy's status)
Case = tuple[str, SignalState, SignalState]


@pytest.mark.parametrize("case", [
    (MANGLED, SignalState.FAILED_DOWNLOAD, SignalState.DOWNLOADING),
    (NEW, SignalState.COMPLETED, SignalState.RESTARTING),
], ids=["FailedDownload-stale-Downloading", "Completed-stale-Restarting"])
async def test_a_request_ended_here_is_not_driven_again_from_a_stale_copy(
        sim: Callable[..., Any], wl1: KubeClient, releases: ReleaseServer,
        case: Case) -> None:
    version, ended, stale = case
    release = releases.releases[version]
    async with sim(start_agent=False) as node:
        agent = RecordingAgent(settings_for(node), wl1)
        plan = await node.request(release)
        downloads = releases.requests[version]
        assert await end_request(agent, node, plan) is ended, node.history
        states = node.states(plan)
        restarts = node.restarts
        assert releases.requests[version] == downloads + 1
        assert restarts == (1 if ended is SignalState.COMPLETED else 0)

        copies = [o for o in agent.delivered if state_of(o) == str(stale)]
        assert copies, f"the agent's watch never delivered a {stale} copy: " \
            f"{[state_of(o) for o in agent.delivered]}"
        # The watch hands the dispatcher a copy older than the agent's own terminal write.
        agent._latest = copies[-1]
        async with anyio.create_task_group() as tg:
            await agent._dispatch(tg)
            redriven = agent._worker
            if redriven is not None:  # the bug: let it do its damage, then say what it did
                with anyio.fail_after(90):
                    await redriven.done.wait()
        assert redriven is None, (
            f"the agent drove {plan} again from its stale {stale} copy after writing "
            f"{ended}: downloads {releases.requests[version] - downloads}, k0s restarts "
            f"{node.restarts}, states {node.states(plan)}")
        assert releases.requests[version] == downloads + 1
        assert node.restarts == restarts
        assert node.states(plan) == states

        # The copy with its own terminal write is housekeeping only: still nothing driven.
        fresh = await wl1.get(node.res, node.name)
        assert state_of(fresh) == str(ended)
        agent._latest = fresh
        async with anyio.create_task_group() as tg:
            await agent._dispatch(tg)
            assert agent._worker is None
        assert node.states(plan) == states and node.restarts == restarts
