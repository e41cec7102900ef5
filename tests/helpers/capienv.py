"""Helpers for tests that run the real Cluster API manager (fleet.testing.capimanager)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.kube import KubeClient
from fleet.kube.resources import NAMESPACES
from fleet.testing.capimanager import CapiEnv
from fleet.testing.providers import ProviderPlayer
from fleet.testing.releases import Release
from fleet.testing.simfarm import SimNodeFarm


@asynccontextmanager
async def capi_namespace(env: CapiEnv) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    await env.client.create(NAMESPACES, {"metadata": {"name": name}})
    try:
        yield name
    finally:
        await env.client.delete(NAMESPACES, name)


@asynccontextmanager
async def playing(player: ProviderPlayer) -> AsyncIterator[ProviderPlayer]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(player.run)
        try:
            yield player
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def provisioned(mgmt: KubeClient, namespace: str, *, wl: KubeClient,
                      kubeconfig: dict[str, Any], root: Path, initial: Release
                      ) -> AsyncIterator[SimNodeFarm]:
    """Cluster API's providers played for ``namespace`` (``ProviderPlayer``), every
    Machine's node a simulated node with a real agent (``SimNodeFarm`` under ``root``,
    running ``initial``) on the workload API server ``wl``; until the block ends."""
    farm = SimNodeFarm(kubeconfig, root, initial)

    async def workload(_ns: str, _cluster: str) -> KubeClient:
        return wl

    player = ProviderPlayer(mgmt, workload, node_factory=farm.node_factory,
                            namespace=namespace)
    async with anyio.create_task_group() as tg:
        await tg.start(farm.run)
        async with playing(player):
            yield farm
        tg.cancel_scope.cancel()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory for simulated nodes (a unix socket's path must stay short)."""
    path = Path(tempfile.mkdtemp(prefix="capi-nodes-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def wait_for(what: str, check: Any, timeout: float = 120.0, interval: float = 0.3
                   ) -> Any:
    """Poll ``check()`` until it returns something truthy."""
    last: Any = None
    try:
        with anyio.fail_after(timeout):
            while True:
                last = await check()
                if last:
                    return last
                await anyio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}") from None
