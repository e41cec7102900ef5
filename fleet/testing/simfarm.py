"""Simulated nodes with real agents for the Machines the real Cluster API creates.

:class:`SimNodeFarm` is a node factory for :class:`fleet.testing.providers.ProviderPlayer`:
for each Machine the player has provisioned it starts a :class:`fleet.testing.simnode.
SimNode` (fake k0s under a supervisor, the real ``k0s-fleet agent``) named after the
Machine, with the Machine's provider ID, so that CAPI links Machine and Node. The nodes
live in the farm's own task (``await tg.start(farm.run)``) and stop when it is cancelled.
Nothing here runs in production.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from fleet.kube import KubeClient, KubeObject
from fleet.testing.releases import Release
from fleet.testing.simnode import SimNode


class SimNodeFarm:
    def __init__(self, kubeconfig: dict[str, Any], root: Path, initial: Release, *,
                 agent_args: Sequence[str] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.root = root
        self.initial = initial
        self.agent_args = list(agent_args)
        self.nodes: dict[str, SimNode] = {}
        self._send, self._receive = anyio.create_memory_object_stream[
            tuple[KubeObject, str, KubeClient]](100)

    async def node_factory(self, machine: KubeObject, provider: str,
                           workload: KubeClient) -> None:
        """Called by the provider player once the Machine's providers are done."""
        await self._send.send((machine, provider, workload))

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._send.close)
            stack.callback(self._receive.close)
            task_status.started()
            async for machine, provider, workload in self._receive:
                name = machine["metadata"]["name"]
                if name in self.nodes:
                    continue
                # Short directory names: the status socket's path must fit a sun_path.
                self.nodes[name] = await stack.enter_async_context(SimNode.running(
                    workload, self.kubeconfig, self.root / f"n{len(self.nodes)}",
                    self.initial, name=name,
                    provider_id=provider, agent_args=self.agent_args))
