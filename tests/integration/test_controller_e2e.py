"""End to end: the controller upgrades simulated nodes running the real agent.

Management API server + one workload API server; a KCP with one control plane and an MD
of two workers (maxUnavailable 1); each node is a SimNode (fake k0s under a supervisor,
real `k0s-fleet agent` subprocess); binaries come from a local release server with
digests pinned in the fleet config.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import pytest

from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import SignalState
from fleet.kube import KubeClient
from fleet.kube.resources import NODE_PLANS
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World
from tests.helpers.controller import (
    InvariantWatcher,
    machine_versions,
    running_controller,
    wait_rollout,
)
from tests.helpers.names import unique

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"


@pytest.fixture(scope="module")
async def infra_crd(mgmt: KubeClient) -> None:
    await ensure_infra_crd(mgmt)


@pytest.mark.anyio
async def test_real_agents_upgrade_a_cluster(  # noqa: PLR0917 - fixtures
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str, tmp_path: Path) -> None:
    kubeconfig = crds_installed["wl1"].kubeconfig()
    fc = await create_cluster(mgmt, wl1, kubeconfig, namespace=namespace, name=unique("e2e"),
                              control_planes=1, workers=2, max_unavailable=1,
                              version=V1, create_nodes=False)
    async with ReleaseServer() as rs:
        old, new = rs.add(V1), rs.add(V2)
        config = FleetConfig.model_validate({
            "management": {"namespace": namespace},
            "clusters": {"namespaces": [namespace]},
            "download": {"urlTemplate": rs.base_url + "/k0s/{version}?arch={arch}",
                         "digests": {V2: {"amd64": new.sha256}}},
            "agent": {"drainTimeout": "20s", "verifyTimeout": "20s"},
            "rollout": {"progressDeadlines": {"pending": "30s", "downloading": "30s",
                                              "cordoning": "30s", "applyingUpdate": "30s",
                                              "restarting": "30s", "verifying": "30s",
                                              "unCordoning": "30s"}},
        })
        watcher = InvariantWatcher(fc, max_unavailable=1, cp_target=V2)
        async with contextlib.AsyncExitStack() as stack:
            nodes = [await stack.enter_async_context(SimNode.running(
                wl1, kubeconfig, tmp_path / name, old, name=name)) for name in fc.machines]
            async with anyio.create_task_group() as tg:
                await tg.start(watcher.run, mgmt, wl1)
                async with running_controller(mgmt, config):
                    await bump(mgmt, fc, V2)
                    await wait_rollout(mgmt, fc, timeout=120)
                tg.cancel_scope.cancel()
            for node in nodes:
                assert await node.running_version() == V2
                assert node.restarts == 1  # exactly one restart per upgrade
                [plan_id] = {t.plan_id for t in node.history}
                assert node.states(plan_id)[-1] == SignalState.COMPLETED
    assert watcher.violations == [], watcher.violations[:5]
    assert set((await machine_versions(mgmt, fc)).values()) == {V2}
    plans = (await mgmt.list(NODE_PLANS, namespace)).items
    assert {p["status"]["phase"] for p in plans} == {NodePlanPhase.COMPLETED}
    assert all(p["spec"]["sha256"] == new.sha256 for p in plans)
    # the fleet config's agent section, durable in each plan (the CRD keeps it)
    policy = {"drainTimeoutSeconds": 20, "drainTimeoutAction": "fail", "verifyTimeoutSeconds": 20,
              "deleteEmptyDirData": False, "force": False}
    assert all(p["spec"].get("nodePolicy") == policy for p in plans), plans
    assert rs.requests[V2] >= len(fc.machines)
