"""Helpers for tests that run the real Cluster API manager (fleet.testing.capimanager)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from fleet.kube.resources import NAMESPACES
from fleet.testing.capimanager import CapiEnv
from fleet.testing.providers import ProviderPlayer


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
