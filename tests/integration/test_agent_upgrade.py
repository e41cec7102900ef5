"""The node agent against a real kube-apiserver, real files and real processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fleet.kube import KubeClient
from fleet.signal import HAPPY_PATH, SignalState
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World

pytestmark = pytest.mark.anyio

OLD = "v1.31.3+k0s.0"
NEW = "v1.32.1+k0s.0"


@pytest.fixture(scope="module")
async def releases() -> AsyncIterator[ReleaseServer]:
    async with ReleaseServer() as rs:
        rs.add(OLD)
        rs.add(NEW, size=8 * 1024 * 1024)
        yield rs


async def test_happy_path(wl1: KubeClient, crds_installed: World, releases: ReleaseServer,
                          tmp_path: Path) -> None:
    kubeconfig = crds_installed["wl1"].kubeconfig()
    async with SimNode.running(wl1, kubeconfig, tmp_path, releases.releases[OLD]) as node:
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, {s for s in SignalState if s.terminal}, timeout=60)
        print(node.log_text())
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, sig.status.reason
        assert node.states(plan) == [str(s) for s in HAPPY_PATH]
        assert await node.running_version() == NEW
        assert node.restarts == 1
