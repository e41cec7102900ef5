"""A NodePlan create answered with a 5xx that landed all the same, on real servers.

A private management kube-apiserver (on the shared etcd, its own prefix, a 4 s
``--request-timeout``) reaches etcd through a proxy. While the proxy holds etcd's replies
(requests still arrive and are committed), the controller's NodePlan POST gets the API
server's 504 although the NodePlan exists. The dispatcher must count it unsure and learn
its fate by a GET before planning again: no second create (no 409 adopt), never more
NodePlans in flight than maxUnavailable, and the rollout completes once etcd answers.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from fleet.kube import KubeClient
from fleet.kube.resources import MACHINE_DEPLOYMENTS, NAMESPACES, NODE_PLANS
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd, set_node_ready
from fleet.testing.proxy import StallingProxy
from fleet.testing.responder import NodeResponder
from fleet.testing.world import (
    CHART_CRDS,
    TEST_CRDS,
    World,
    capi_crds_dir,
    crd_documents,
    install_crds,
)
from tests.helpers.controller import (
    V2,
    InvariantWatcher,
    fleet_config,
    running_controller,
    wait_rollout,
)
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio


async def _wait(pred: Any, timeout: float, what: str) -> Any:
    with anyio.fail_after(timeout):
        while not (got := await pred()):
            await anyio.sleep(0.2)
    assert got, what
    return got


async def test_create_answered_with_504_is_settled_not_repeated(
        crds_installed: World, wl1: KubeClient, caplog: pytest.LogCaptureFixture) -> None:
    world = crds_installed
    caplog.set_level(logging.WARNING, logger="fleet.controllers.dispatcher")
    async with StallingProxy(world.etcd.port) as proxy:
        server = await anyio.to_thread.run_sync(lambda: world.add_server(
            unique("unsure"), extra_args=["--request-timeout=4s"],
            etcd_url=f"http://127.0.0.1:{proxy.port}"))
        try:
            async with await server.client() as mgmt:
                await install_crds(mgmt, crd_documents(CHART_CRDS, TEST_CRDS, capi_crds_dir()))
                await ensure_infra_crd(mgmt)
                namespace = unique("ns")
                await mgmt.create(NAMESPACES, {"metadata": {"name": namespace}})
                fc = await create_cluster(mgmt, wl1, world["wl1"].kubeconfig(),
                                          namespace=namespace, name=unique("uns"),
                                          control_planes=0, workers=3, max_unavailable=1)
                # One node NotReady spends the budget: nothing is dispatched until it is
                # Ready again, which the test does while etcd's replies are held.
                held_back = fc.workers[-1]
                await set_node_ready(wl1, held_back, False)
                watcher = InvariantWatcher(fc, max_unavailable=1)
                responder = NodeResponder(wl1, step_seconds=0.02,
                                          only=lambda n: n in fc.machines)
                async with anyio.create_task_group() as tg:
                    await tg.start(watcher.run, mgmt, wl1)
                    await tg.start(responder.run)
                    async with running_controller(mgmt, fleet_config(namespace)) as ctl:
                        await bump(mgmt, fc, V2)

                        async def budget_spent() -> bool:
                            md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md or "", namespace)
                            return any("unavailable of maxUnavailable 1" in
                                       (c.get("message") or "") for c in
                                       (md.get("status") or {}).get("conditions") or [])
                        await _wait(budget_spent, 60, "MD waiting on the NotReady node")
                        assert ctl.dispatcher.stats.by_action.get("CreateNodePlan", 0) == 0

                        proxy.stall(replies_only=True)
                        try:
                            await set_node_ready(wl1, held_back, True)  # wl1: no proxy

                            dispatcher = ctl.dispatcher

                            async def create_answered() -> bool:
                                # Unsure (fixed), or its provisional copy forgotten (the
                                # private server holds no other NodePlan).
                                return bool(dispatcher.unsure) or (
                                    dispatcher.stats.by_action.get("CreateNodePlan", 0) >= 1
                                    and len(dispatcher.view[NODE_PLANS]) == 0)
                            await _wait(create_answered, 60, "the NodePlan create answered")
                            assert dispatcher.stats.by_action["CreateNodePlan"] == 1
                            assert dispatcher.unsure, "a create answered 504 was forgotten"
                            [(ns, plan_name)] = dispatcher.unsure
                            assert ns == namespace

                            # Keep etcd's replies held until the next pass was due: it
                            # must wait on the GET (which times out too), not plan the
                            # node as undispatched and create its NodePlan again.
                            async def next_pass_due() -> bool:
                                return any("cannot tell whether NodePlan" in r.getMessage()
                                           for r in caplog.records) or \
                                    dispatcher.stats.by_action["CreateNodePlan"] > 1
                            await _wait(next_pass_due, 60, "the next pass due")
                            assert dispatcher.stats.by_action["CreateNodePlan"] == 1
                        finally:
                            proxy.resume()
                        # The POST got no success, yet the NodePlan exists: it landed.
                        plan = await mgmt.get(NODE_PLANS, plan_name, namespace)
                        assert plan["metadata"]["uid"]
                        await wait_rollout(mgmt, fc, timeout=120)
                        assert not ctl.dispatcher.unsure
                        stats = ctl.dispatcher.stats
                        # Settled by the GET: no second create answered 409 and adopted.
                        assert stats.already == 0, stats
                        assert stats.by_action["CreateNodePlan"] == 3, stats
                    tg.cancel_scope.cancel()
        finally:
            await anyio.to_thread.run_sync(world.remove_server, server.name)
    assert watcher.violations == [], watcher.violations[:5]
    assert watcher.max_seen_unavailable == 1
    assert all(len(r) == 1 for r in responder.requests.values())  # one request per node
    assert len(watcher.plan_uids) == 3
