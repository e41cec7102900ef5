"""`plan`/`status` read every workload cluster at once, bounded (issue #12 item 6): with
clusters whose API server hangs, they all wait in parallel (one timeout in total, not one
each), and each is reported unreachable."""

from __future__ import annotations

import pytest

from fleet.kube import KubeClient
from fleet.kube.resources import CLUSTERS, SECRETS
from fleet.rollout.observe import observe
from fleet.testing.proxy import StallingProxy
from fleet.testing.world import World
from fleet.world.clusters import kubeconfig_secret
from tests.helpers.waves import fleet_config

pytestmark = pytest.mark.anyio

CLUSTERS_N = 6
TIMEOUT = 10.0


async def test_observe_reads_hanging_clusters_in_parallel(
        world: World, mgmt: KubeClient, namespace: str) -> None:
    async with StallingProxy(world["wl1"].port) as proxy:
        proxy.stall()
        kubeconfig = world["wl1"].kubeconfig()
        kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        for i in range(CLUSTERS_N):
            name = f"hang-{i}"
            await mgmt.create(CLUSTERS, {"metadata": {"name": name, "namespace": namespace},
                                         "spec": {"paused": False}})
            await mgmt.create(SECRETS, kubeconfig_secret(f"{name}-kubeconfig", namespace,
                                                         name, kubeconfig))
        obs = await observe(mgmt, fleet_config(namespace), node_timeout=TIMEOUT,
                            concurrency=4)
        t = proxy.accepted_at
        assert len(t) >= CLUSTERS_N
        # Four at once: the 4th was connected before the 1st could have timed out (one
        # at a time, each waits out its timeout first) ...
        assert t[3] - t[0] < TIMEOUT, [round(x - t[0], 1) for x in t]
        # ... and no more than four: the 5th had to wait for one of them to time out.
        assert t[4] - t[0] >= TIMEOUT * 0.5, [round(x - t[0], 1) for x in t]
    assert len(obs.problems) == CLUSTERS_N
    assert all(obs.snapshot.nodes[k] is None for k in obs.problems)
