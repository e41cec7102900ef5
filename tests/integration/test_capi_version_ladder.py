"""Issue #30's proof next to the real Cluster API manager, with real agents: a FleetUpgrade
from v1.30 to v1.32 over two clusters in two waves, one of them with k0smotron's hosted
control plane (K0smotronControlPlane, its stand-in), is climbed one minor at a time.

The real CAPI manager (newest pinned version, default feature gates) owns the Machines
and MachineSets; the providers are played through their contracts; every worker Machine's
node is a simulated node running the real ``k0s-fleet agent``, which downloads each rung's
binary from a local release server (digest pinned), swaps it and restarts. An independent
watcher (tests.helpers.skew) checks k0s's skew rules at every watch event of Machines,
K0sControlPlanes and hosted control planes. The run must end on v1.32 everywhere, every
node having run the rung's binary before the target's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.cli.exit import Exit
from fleet.cli.upgrade import apply_upgrade, follow
from fleet.config.models import FleetConfig
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    K0SMOTRON_CONTROL_PLANES,
    MACHINES,
    NODE_PLANS,
)
from fleet.testing.capi import create_capi_cluster
from fleet.testing.capimanager import CapiEnvs, capi_version
from fleet.testing.k0smotron import HostedControlPlaneStandIn
from fleet.testing.releases import ReleaseServer
from fleet.testing.world import World
from tests.helpers.capienv import capi_namespace, provisioned, wait_for
from tests.helpers.controller import Lines, policy_controller
from tests.helpers.names import unique
from tests.helpers.skew import FleetSkewWatcher

pytestmark = pytest.mark.anyio

OLD, RUNG, TARGET = "v1.30.9+k0s.0", "v1.31.5+k0s.0", "v1.32.1+k0s.0"


def ladder_config(namespace: str, download: str, digests: dict[str, str]) -> FleetConfig:
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": download,
                     "digests": {v: {"amd64": d} for v, d in digests.items()},
                     # what the release source offers: the ladder takes v1.31's newest
                     "releases": ["v1.31.2+k0s.0", RUNG, TARGET]},
        "agent": {"drainTimeout": "20s", "verifyTimeout": "20s"},
        "rollout": {
            "waves": [{"name": "canary", "canary": True, "soakSeconds": "1s",
                       "clusterSelector": {"matchLabels": {"ring": "canary"}}}],
            "progressDeadlines": {k: "60s" for k in (
                "pending", "downloading", "cordoning", "applyingUpdate", "restarting",
                "verifying", "unCordoning")}},
    })


async def _linked(mgmt: KubeClient, ns: str, count: int) -> bool:
    ms = [m for m in (await mgmt.list(MACHINES, ns)).items
          if ((m.get("status") or {}).get("nodeRef") or {}).get("name")]
    return len(ms) == count


async def _state(mgmt: KubeClient, ns: str) -> dict[str, Any]:
    return {
        "machines": {m["metadata"]["name"]: m["spec"].get("version")
                     for m in (await mgmt.list(MACHINES, ns)).items},
        "hosted": {o["metadata"]["name"]: (o["spec"].get("version"), o.get("status"))
                   for o in (await mgmt.list(K0SMOTRON_CONTROL_PLANES, ns)).items},
        "nodePlans": {p["metadata"]["name"]: (p["spec"]["version"],
                                              (p.get("status") or {}).get("phase"))
                      for p in (await mgmt.list(NODE_PLANS, ns)).items},
    }


async def test_two_clusters_one_hosted_climb_two_minors_next_to_the_real_capi(
        capi_envs: CapiEnvs, crds_installed: World, wl1: KubeClient,
        short_tmp: Path) -> None:
    env = await capi_envs.get(capi_version())
    mgmt = env.client
    kubeconfig = crds_installed["wl1"].kubeconfig()
    async with capi_namespace(env) as ns, ReleaseServer() as rs:
        old, rung, target = rs.add(OLD), rs.add(RUNG), rs.add(TARGET)
        config = ladder_config(ns, rs.base_url + "/k0s/{version}?arch={arch}",
                               {RUNG: rung.sha256, TARGET: target.sha256})
        async with provisioned(mgmt, ns, wl=wl1, kubeconfig=kubeconfig, root=short_tmp,
                               initial=old) as farm:
            a = await create_capi_cluster(mgmt, kubeconfig, namespace=ns, name=unique("la"),
                                          version=OLD, workers=2, max_unavailable=1,
                                          max_surge=0, control_plane_replicas=0)
            b = await create_capi_cluster(mgmt, kubeconfig, namespace=ns, name=unique("lb"),
                                          version=OLD, workers=2, max_unavailable=1,
                                          max_surge=0, control_plane_replicas=2, hosted=True)
            await mgmt.patch(CLUSTERS, a.name, {"metadata": {"labels": {"ring": "canary"}}},
                             ns)
            await wait_for("4 Machines linked to Nodes", lambda: _linked(mgmt, ns, 4), 180)
            workers = {m["metadata"]["name"]: m["spec"]["clusterName"]
                       for m in (await mgmt.list(MACHINES, ns)).items}
            watcher = FleetSkewWatcher([a.name, b.name])
            hosted = HostedControlPlaneStandIn(mgmt, ns, step_seconds=0.2)
            async with anyio.create_task_group() as tg:
                await tg.start(watcher.watch, mgmt, ns)
                await tg.start(hosted.run)
                async with policy_controller(mgmt, config):
                    obj = await apply_upgrade(mgmt, namespace=ns, name="two-minors",
                                              version=TARGET, selector=None)
                    out = Lines()
                    try:
                        with anyio.fail_after(480):
                            rc = await follow(mgmt, namespace=ns, name="two-minors",
                                              generation=obj["metadata"]["generation"],
                                              out=out, poll=0.5)
                    except TimeoutError:
                        raise AssertionError(
                            f"not complete: {out.lines[-3:]}; {await _state(mgmt, ns)}"
                        ) from None
                    assert rc == Exit.OK, (out.lines[-5:], await _state(mgmt, ns))

                    async def machines_moved() -> bool:
                        ms = (await mgmt.list(MACHINES, ns)).items
                        return {m["spec"]["version"] for m in ms} == {TARGET}

                    await wait_for("every Machine's version at the target", machines_moved)
                tg.cancel_scope.cancel()
            assert watcher.violations == [], watcher.violations[:5]
            for n in farm.nodes.values():
                assert await n.running_version() == TARGET, (n.name, n.history)
                assert n.restarts == 2, (n.name, n.history)  # the rung, then the target
        # k0smotron rolled the hosted control plane once per rung; the watcher saw every
        # object of both clusters end on the target
        assert hosted.rolled == [(b.kcp, RUNG), (b.kcp, TARGET)]
        assert set(watcher.versions_now.values()) == {TARGET}, watcher.versions_now
        assert set(watcher.versions_now) >= set(workers) | {b.kcp}
        plans = (await mgmt.list(NODE_PLANS, ns)).items
        per_node = {w: sorted(p["spec"]["version"] for p in plans
                              if p["spec"]["machineName"] == w) for w in workers}
        assert per_node == {w: [RUNG, TARGET] for w in workers}, per_node
        assert {p["status"]["phase"] for p in plans} == {"Completed"}
