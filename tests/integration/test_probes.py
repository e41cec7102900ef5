"""Probes tell the truth (issue #12 item 5), on real API servers.

/readyz is 503 while the controller's management caches are not synced (its API server
stalls), and 200 once they are; /healthz turns 503 when the control loop is wedged; a
management cluster without the Cluster API CRDs does not hang the start-up (issue #12
item 2: a missing CRD is an empty, synced cache).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
import pytest

from fleet.cli.probes import probes
from fleet.controllers.runner import FleetController
from fleet.extension.exclusion import ExtensionExclusion
from fleet.kube import KubeClient
from fleet.status.server import StatusBoard, make_app, serve
from fleet.testing.proxy import StallingProxy
from fleet.testing.world import ApiServer, World
from tests.helpers.controller import fleet_config, tuning
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio


async def _get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def _until(port: int, path: str, status: int, timeout: float = 60) -> str:
    last: tuple[int, str] = (0, "")
    with anyio.fail_after(timeout):
        while True:
            last = await _get(port, path)
            if last[0] == status:
                return last[1]
            await anyio.sleep(0.2)


async def _served(tg: anyio.abc.TaskGroup, controller: FleetController, mgmt: KubeClient,
                  namespace: str) -> int:
    config = controller.config
    exclusion = ExtensionExclusion(mgmt, config, None)
    app = make_app(StatusBoard(), health=probes(controller, exclusion, config).health)
    port: int = await tg.start(lambda task_status: serve(
        app, host="127.0.0.1", port=0, task_status=task_status))
    return port


async def test_readyz_waits_for_synced_caches(crds_installed: World, namespace: str,
                                              mgmt: KubeClient) -> None:
    server = crds_installed["mgmt"]
    async with StallingProxy(server.port) as proxy:
        proxy.stall()
        cfg = server.kubeconfig()
        cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        async with await KubeClient.from_kubeconfig(cfg, name="stalled") as client:
            controller = FleetController(client, fleet_config(namespace), tuning=tuning())
            async with anyio.create_task_group() as tg:
                port = await _served(tg, controller, mgmt, namespace)
                tg.start_soon(controller.run)
                body = await _until(port, "/readyz", 503)
                assert "management caches not synced" in body
                proxy.resume()
                await _until(port, "/readyz", 200)
                assert (await _get(port, "/healthz"))[0] == 200
                tg.cancel_scope.cancel()


async def test_healthz_fails_when_the_loop_is_wedged(mgmt: KubeClient, namespace: str) -> None:
    wedge = anyio.Event()

    async def policy(_snapshot: Any) -> None:
        if wedge.is_set():
            await anyio.sleep_forever()  # a pass that never returns

    controller = FleetController(mgmt, fleet_config(namespace), policy=policy,
                                 tuning=tuning(wedged_after=2))
    async with anyio.create_task_group() as tg:
        port = await _served(tg, controller, mgmt, namespace)
        await tg.start(controller.run)
        await _until(port, "/readyz", 200)
        assert (await _get(port, "/healthz"))[0] == 200
        wedge.set()
        controller.trigger.poke()
        body = await _until(port, "/healthz", 503)
        assert "planning pass has been running" in body
        tg.cancel_scope.cancel()


@pytest.fixture(scope="module")
async def bare_server(crds_installed: World) -> AsyncIterator[ApiServer]:
    """An API server with none of the CRDs (no Cluster API, no NodePlan)."""
    server = await anyio.to_thread.run_sync(crds_installed.add_server, unique("bare"))
    try:
        yield server
    finally:
        await anyio.to_thread.run_sync(server.stop)


async def test_start_up_does_not_hang_on_missing_crds(bare_server: ApiServer) -> None:
    async with await bare_server.client() as client:
        controller = FleetController(client, fleet_config("default"), tuning=tuning())
        async with anyio.create_task_group() as tg:
            port = await _served(tg, controller, client, "default")
            with anyio.fail_after(60):
                await tg.start(controller.run)
            await _until(port, "/readyz", 200)
            absent = {str(r.res) for r in controller.view.reflectors if r.absent}
            assert absent, "the CRD-backed kinds should be reported absent"
            with anyio.fail_after(30):
                while controller.stats.passes < 1:  # and it plans (nothing to do)
                    await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
