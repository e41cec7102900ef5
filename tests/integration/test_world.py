"""The test world itself: pinned versions really run, CRDs are served."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.kube import KubeClient
from fleet.kube.resources import CRDS, MACHINES, NAMESPACES, NODE_PLANS
from fleet.testing.world import World

pytestmark = pytest.mark.anyio

PINS = Path(__file__).resolve().parents[2] / "hack" / "testenv" / "pins.env"


def pin(name: str) -> str:
    for line in PINS.read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise KeyError(name)


async def test_api_server_reports_the_pinned_version(mgmt: KubeClient) -> None:
    version = await mgmt.server_version()
    assert version["gitVersion"] == pin("KUBE_VERSION")


async def test_every_server_serves_the_crds(world: World, mgmt: KubeClient,
                                            wl1: KubeClient, wl2: KubeClient) -> None:
    for client in (mgmt, wl1, wl2):
        names = {c["metadata"]["name"] for c in (await client.list(CRDS)).items}
        assert "nodeplans.fleet.k0s-fleet.io" in names
        assert "machines.cluster.x-k8s.io" in names
        await client.list(NODE_PLANS)
        await client.list(MACHINES)
    assert all(s.startup_seconds > 0 for s in world.servers.values())


async def test_servers_are_isolated(mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    """One etcd, distinct prefixes: a namespace made in mgmt does not exist in wl1."""
    assert await mgmt.get_or_none(NAMESPACES, namespace) is not None
    assert await wl1.get_or_none(NAMESPACES, namespace) is None
