"""Shared fixtures. Integration fixtures start one real test world per pytest process."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

from fleet.kube import KubeClient
from fleet.testing.capimanager import CapiEnvs
from fleet.testing.world import World
from tests.helpers.names import fresh_namespace

WORLD_SERVERS = ["mgmt", "wl1", "wl2"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    """etcd + a management API server + two workload API servers, shared by the session."""
    w = World(WORLD_SERVERS)
    w.start()
    startup = {n: round(s.startup_seconds, 2) for n, s in w.servers.items()}
    print(f"\n[test world] kube-apiserver start-up seconds: {startup}")
    if os.environ.get("K0S_FLEET_TIMINGS"):
        with open(os.environ["K0S_FLEET_TIMINGS"], "a") as fh:
            fh.write(f"apiserver_startup_seconds {startup}\n")
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(scope="session")
async def crds_installed(world: World) -> World:
    await world.install_crds()
    return world


@pytest.fixture(scope="session")
async def mgmt(crds_installed: World) -> AsyncIterator[KubeClient]:
    async with await crds_installed["mgmt"].client() as c:
        yield c


@pytest.fixture(scope="session")
async def wl1(crds_installed: World) -> AsyncIterator[KubeClient]:
    async with await crds_installed["wl1"].client() as c:
        yield c


@pytest.fixture(scope="session")
async def wl2(crds_installed: World) -> AsyncIterator[KubeClient]:
    async with await crds_installed["wl2"].client() as c:
        yield c


@pytest.fixture(scope="session")
async def capi_envs(crds_installed: World) -> AsyncIterator[CapiEnvs]:
    """Real Cluster API managers, each on its own management API server of the session's
    world, started on first use (``await capi_envs.get(version, gates)``)."""
    envs = CapiEnvs(crds_installed)
    try:
        yield envs
    finally:
        started = {e.name: round(e.manager.startup_seconds, 2) for e in envs.started()}
        if started:
            print(f"\n[test world] CAPI manager start-up seconds: {started}")
        await envs.close()


@pytest.fixture
async def namespace(mgmt: KubeClient) -> AsyncIterator[str]:
    """A fresh namespace in the management cluster, deleted afterwards."""
    async with fresh_namespace(mgmt) as name:
        yield name


