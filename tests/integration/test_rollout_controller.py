"""The rollout policy inside the real controller (fleet.controllers.runner), on real API
servers: the gate is the controller's ``policy`` (RolloutPolicy, given at construction),
the node side is the scripted responder (fleet.testing.responder), the clock is the real
one with short soaks (waited on as conditions, never slept)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import anyio
import pytest

from fleet.config.models import FleetConfig
from fleet.contract.signal import SignalState
from fleet.controllers.runner import FleetController, Tuning
from fleet.events import EventRecorder, list_events
from fleet.kube import KubeClient
from fleet.kube.resources import CLUSTERS, CONFIGMAPS, NODE_PLANS
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.observe import observe
from fleet.rollout.plan import dry_run, plan_document
from fleet.rollout.policy import RolloutPolicy
from fleet.rollout.state import RolloutState
from fleet.status.health import Health
from fleet.status.server import StatusBoard, make_app, serve
from fleet.testing.capi import FleetCluster, bump, create_cluster
from fleet.testing.responder import Behaviour, NodeResponder
from fleet.testing.world import World
from fleet.world.model import parse_time
from tests.helpers.names import unique

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
CANARY = {"k0s-fleet.io/ring": "canary"}
PROD = {"k0s-fleet.io/ring": "prod"}


def config(namespace: str, soak: str = "2s") -> FleetConfig:
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                     "allowUnverified": True},
        "agent": {"drainTimeout": "1s", "verifyTimeout": "1s"},
        "rollout": {"waves": [
            {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
             "soakSeconds": soak},
            {"name": "prod", "clusterSelector": {"matchLabels": PROD},
             "maxConcurrentClusters": 1}]},
    }, by_alias=True, by_name=False)


async def _cluster(mgmt: KubeClient, wl: KubeClient, world: World, server: str,  # noqa: PLR0917
                   namespace: str, labels: dict[str, str]) -> FleetCluster:
    name = unique("c")
    fc = await create_cluster(mgmt, wl, world[server].kubeconfig(), namespace=namespace,
                              name=name, control_planes=0, workers=2, max_unavailable=1)
    await mgmt.patch(CLUSTERS, name, {"metadata": {"labels": labels}}, namespace)
    return fc


def _health(controller: FleetController) -> Health:
    health = Health()
    health.ready.add("controller", controller.readiness_problem)
    health.live.add("controller", controller.liveness_problem)
    return health


@contextlib.asynccontextmanager
async def rollout_controller(mgmt: KubeClient, cfg: FleetConfig
                             ) -> AsyncIterator[tuple[FleetController, StatusBoard, int]]:
    # composed as the controller's entry point does: the policy given at construction
    board = StatusBoard()
    recorder = EventRecorder(mgmt, instance="k0s-fleet",
                             default_namespace=cfg.management.namespace)
    policy = RolloutPolicy(mgmt, cfg, recorder=recorder, board=board)
    controller = FleetController(mgmt, cfg, tuning=Tuning(watch_timeout=30), policy=policy,
                                 recorder=recorder)
    async with anyio.create_task_group() as tg:
        # the status server on a free port (the entry point serves it on status.port)
        port = await tg.start(lambda task_status: serve(
            make_app(board, health=_health(controller)), host="127.0.0.1",
            port=0, task_status=task_status))
        tg.start_soon(policy.run, controller.trigger.poke, controller.clock)
        await tg.start(controller.run)
        try:
            yield controller, board, port
        finally:
            tg.cancel_scope.cancel()


async def _started(mgmt: KubeClient, namespace: str) -> list[dict[str, Any]]:
    plans = [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
             if (p.get("status") or {}).get("startedAt")]
    return sorted(plans, key=lambda p: p["status"]["startedAt"])


async def _wait(predicate: Any, timeout: float = 60) -> None:
    with anyio.fail_after(timeout):
        while not await predicate():
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_controller_rolls_waves_in_order_with_soak_as_planned(
        world: World, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient,
        namespace: str) -> None:
    can = await _cluster(mgmt, wl1, world, "wl1", namespace, CANARY)
    prod = await _cluster(mgmt, wl2, world, "wl2", namespace, PROD)
    cfg = config(namespace)
    for fc in (can, prod):
        await bump(mgmt, fc, V2)
    planned = plan_document(dry_run(await observe(mgmt, cfg), cfg,
                                    now=(await observe(mgmt, cfg)).snapshot.now))
    expected = [n for s in planned["steps"] for n in s["nodes"]]
    # canary first; inside a cluster the planner's order (oldest Machine first)
    assert set(expected[:2]) == set(can.workers) and set(expected[2:]) == set(prod.workers)

    names = set(can.machines + prod.machines)
    r1 = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in names)
    r2 = NodeResponder(wl2, step_seconds=0.02, only=lambda n: n in names)
    async with anyio.create_task_group() as tg:
        await tg.start(r1.run)
        await tg.start(r2.run)
        async with rollout_controller(mgmt, cfg) as (_, board, port):
            async def done() -> bool:
                s = board.status
                return s is not None and s["rollout"]["phase"] == "Complete"

            await _wait(done)
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/status") as r:
                    doc = await r.json()
                metrics = ""

                async def counted() -> bool:
                    nonlocal metrics
                    async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                        metrics = await r.text()
                    return "k0s_fleet_node_upgrades_completed_total 4.0" in metrics

                with contextlib.suppress(TimeoutError):
                    await _wait(counted, timeout=10)
        tg.cancel_scope.cancel()

    plans = await _started(mgmt, namespace)
    assert [p["spec"]["nodeName"] for p in plans] == expected  # as planned
    cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace)
    state = RolloutState.from_json(cm["data"][STATE_KEY])
    canary_done = state.waves["canary"].completed_at
    assert canary_done is not None
    starts = [parse_time(p["status"]["startedAt"]) for p in plans
              if p["spec"]["clusterName"] == prod.name]
    first_prod = min(t for t in starts if t is not None)
    assert first_prod >= canary_done + timedelta(seconds=2)  # soak honoured
    assert doc["rollout"]["phase"] == "Complete"
    assert doc["summary"]["nodesUpToDate"] == 4
    totals = [line for line in metrics.splitlines() if "_total" in line and "#" not in line]
    assert "k0s_fleet_node_upgrades_completed_total 4.0" in totals, totals
    assert 'k0s_fleet_node_upgrades_started_total{role="worker"} 4.0' in totals, totals
    assert 'k0s_fleet_rollout_phase{phase="Complete"} 1.0' in metrics
    reasons = [e["reason"] for e in await list_events(mgmt, namespace)]
    assert reasons.count("WaveStarted") == 2
    assert "UpgradeAdmitted" in reasons and "UpgradeCompleted" in reasons


@pytest.mark.anyio
async def test_controller_canary_failure_halts_the_fleet(
        world: World, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient,
        namespace: str) -> None:
    can = await _cluster(mgmt, wl1, world, "wl1", namespace, CANARY)
    prod = await _cluster(mgmt, wl2, world, "wl2", namespace, PROD)
    for fc in (can, prod):
        await bump(mgmt, fc, V2)
    names = set(can.machines + prod.machines)
    r1 = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in names)
    r1.behave(can.workers[0], Behaviour(fail_at=SignalState.DOWNLOADING))
    r2 = NodeResponder(wl2, step_seconds=0.02, only=lambda n: n in names)
    async with anyio.create_task_group() as tg:
        await tg.start(r1.run)
        await tg.start(r2.run)
        async with rollout_controller(mgmt, config(namespace, soak="0s")) as (c, board, _):
            async def halted() -> bool:
                s = board.status
                return s is not None and s["rollout"]["phase"] == "Halted"

            await _wait(halted)
            passes = c.stats.passes
            # Keep the controller busy for a while: nothing new may start anywhere.
            await _wait(lambda: _true_after(c, passes + 3), timeout=30)
            c.trigger.poke()
        tg.cancel_scope.cancel()
    plans = await _started(mgmt, namespace)
    assert [p["spec"]["nodeName"] for p in plans] == can.workers[:1]
    assert plans[0]["status"]["phase"] == "Failed"
    halted_events = [e for e in await list_events(mgmt, namespace)
                     if e["reason"] == "RolloutHalted"
                     and e["regarding"]["name"] == ROLLOUT_CONFIGMAP]
    assert len(halted_events) == 1 and can.name in halted_events[0]["note"]


async def _true_after(c: FleetController, passes: int) -> bool:
    c.trigger.poke()
    return c.stats.passes >= passes
