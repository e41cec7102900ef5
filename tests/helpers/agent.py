"""The agent's test world: its releases and simulated nodes (tests/integration/test_agent_*)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from fleet.contract.signal import CORDONED_BY_KEY, SignalState
from fleet.kube import KubeClient, KubeObject
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World

OLD = "v1.31.3+k0s.0"
NEW = "v1.32.1+k0s.0"
BROKEN = "v1.32.2+k0s.0"
STALLS = "v1.32.3+k0s.0"
MANGLED = "v1.32.4+k0s.0"
TERMINAL = {s for s in SignalState if s.terminal}


@pytest.fixture(scope="module")
async def releases() -> AsyncIterator[ReleaseServer]:
    async with ReleaseServer() as rs:
        rs.add(OLD)
        rs.add(NEW, size=16 * 1024 * 1024)
        rs.add(BROKEN, broken=True)
        rs.add(STALLS, size=1024 * 1024)
        rs.fail(STALLS, "stall")
        rs.add(MANGLED)
        rs.fail(MANGLED, "wrong-bytes")
        yield rs


@pytest.fixture
def sim(wl1: KubeClient, crds_installed: World, releases: ReleaseServer,
        tmp_path: Path) -> Callable[..., Any]:
    kubeconfig = crds_installed["wl1"].kubeconfig()

    def make(**kw: Any) -> Any:
        kw.setdefault("initial", releases.releases[OLD])
        root = kw.pop("root", tmp_path)
        return SimNode.running(wl1, kw.pop("kubeconfig", kubeconfig), root, **kw)

    return make


def uncordoned(obj: KubeObject) -> bool:
    return not (obj.get("spec") or {}).get("unschedulable") and \
        CORDONED_BY_KEY not in ((obj.get("metadata") or {}).get("annotations") or {})
