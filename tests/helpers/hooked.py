"""Real clients whose requests a test can watch or hold back (no patched-out client:
every request is still sent to the real API server once the hook returns)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fleet.kube import KubeClient
from fleet.world.clusters import ClientFactory

# Shown every request (method, path without query) before it is sent; it may note it or
# hold it back (await something).
RequestHook = Callable[[str, str], Awaitable[None]]


class HookedClient(KubeClient):
    """A real client that first shows every request to its hook."""

    hook: RequestHook

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        await self.hook(method, path)
        return await super().request(method, path, **kw)


def hooked(client: KubeClient, hook: RequestHook) -> HookedClient:
    """``client``'s connection, each request shown to ``hook`` first (closing either
    closes both)."""
    out = HookedClient(client._api, name=client.name)
    out.hook = hook
    return out


def hooked_factory(hook: RequestHook) -> ClientFactory:
    """A workload ClientFactory (as the registry's own: ``for_many``) of hooked clients."""
    async def factory(kubeconfig: Mapping[str, Any], name: str) -> KubeClient:
        return hooked(await KubeClient.for_many(kubeconfig, name=name), hook)

    return factory
