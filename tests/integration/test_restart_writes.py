"""A restarted controller over a settled fleet writes nothing (issue #13 item 3).

Several CAPI clusters (all on the shared workload API server ``wl1``, each with its own
client and watches as in production), a FleetUpgrade whose version every node already runs, the
rollout policy as in production. A first controller writes what it has to say and goes
quiet; it is stopped; a second one starts on the same world. Before, its first pass ran
before the workload caches were listed: it wrote "workload cluster unreachable" into the
MachineDeployments, K0sControlPlanes and the FleetUpgrade's status, then wrote them back
once the Nodes arrived. Now no pass runs before every workload cluster has answered, so
the real API server records no write at all: every object's resourceVersion (bumped by
any write that changes it) is what it was before the restart.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from fleet.cli.upgrade import apply_upgrade
from fleet.controllers.runner import FleetController
from fleet.controllers.takeover import Sharding
from fleet.kube import KubeClient, resources
from fleet.kube.resources import (
    CONFIGMAPS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
)
from fleet.testing.capi import FleetCluster, ensure_infra_crd
from fleet.testing.world import World
from fleet.world.model import Snapshot
from tests.helpers.capienv import wait_for
from tests.helpers.controller import (
    all_up_to_date,
    intent_config,
    policy_controller,
    running_controller,
    small_cluster,
    tuning,
)
from tests.helpers.hooked import hooked, hooked_factory

V1 = "v1.31.2+k0s.0"
CLUSTERS = 4
pytestmark = pytest.mark.anyio

MANAGEMENT = (MACHINE_DEPLOYMENTS, MACHINE_SETS, K0S_CONTROL_PLANES, MACHINES, NODE_PLANS,
              FLEET_UPGRADES, CONFIGMAPS)


async def versions(mgmt: KubeClient, wl: KubeClient, namespace: str,
                   fcs: list[FleetCluster]) -> dict[tuple[str, str], str]:
    """resourceVersion of every object the controller may write."""
    out: dict[tuple[str, str], str] = {}
    for res in MANAGEMENT:
        for o in (await mgmt.list(res, namespace)).items:
            out[(res.kind, o["metadata"]["name"])] = o["metadata"]["resourceVersion"]
    ours = {m for fc in fcs for m in fc.machines}
    for n in (await wl.list(NODES)).items:
        if n["metadata"]["name"] in ours:
            out[("Node", n["metadata"]["name"])] = n["metadata"]["resourceVersion"]
    return out


async def quiet(ctl: FleetController) -> bool:
    """It has planned, nothing is in flight, no change waits for a pass."""
    return ctl.stats.passes > 0 and not ctl.performer.inflight and ctl.trigger.first_poke is None


async def test_a_restarted_controller_writes_no_status_on_a_settled_fleet(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    fcs = [await small_cluster(mgmt, wl1, world, namespace, prefix="rs", control_planes=1,
                               workers=2, version=V1) for _ in range(CLUSTERS)]
    await apply_upgrade(mgmt, namespace=namespace, name="steady", version=V1, selector=None)
    cfg = intent_config(namespace)

    async def settled() -> bool:
        fu = await mgmt.get(FLEET_UPGRADES, "steady", namespace)
        return await all_up_to_date(mgmt, fcs) and \
            (fu.get("status") or {}).get("phase") == "Complete"

    stages: list[tuple[str, bool]] = []  # the start-up's marks (the CLI freezes the heap)
    async with policy_controller(mgmt, cfg, after_start_up=lambda stage: stages.append(
            (stage, bool(first.performer.inflight)))) as first:
        await wait_for("the first controller's status written", settled, 120, 0.1)
        await wait_for("the first controller quiet", lambda: quiet(first), 60, 0.1)
        async def marked() -> bool:
            return len(stages) == 2

        await wait_for("its start-up marked done", marked, 30, 0.1)
    # the first pass had writes to send (status of a fresh fleet): "first quiet" came once
    # they were all done
    assert stages == [("first pass", False), ("first quiet", False)]
    assert first.stats.actions > 0
    before = await versions(mgmt, wl1, namespace, fcs)
    assert len(before) > CLUSTERS * 6  # the objects are there to be compared

    async with policy_controller(mgmt, cfg) as second:
        # Its first pass comes only once every cluster's Nodes are listed; it plans every
        # cluster then: whatever it would write is sent by the time it is quiet.
        await wait_for("the second controller planned, quiet", lambda: quiet(second), 120,
                       0.1)
        assert all(second.registry.settled((namespace, fc.name)) for fc in fcs)
        assert second.stats.clusters_planned >= CLUSTERS
        after = await versions(mgmt, wl1, namespace, fcs)
    written = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert written == [], f"the restarted controller wrote {written}"
    assert second.stats.actions == 0


class Toggle:
    """A shard (fleet.controllers.takeover.Shard) that acts on nothing until switched on."""

    def __init__(self) -> None:
        self.on = False

    def acts_on(self, cluster: tuple[str, str]) -> bool:
        return self.on


async def test_a_shard_taken_over_is_planned_only_once_its_workload_cluster_answered(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    """A replica that takes clusters over (sharding) does not plan them before their
    workload caches are listed: planned on an empty cache they would get "workload cluster
    unreachable" written into their MachineDeployments and K0sControlPlanes, and written
    back once the Nodes arrive. Settled clusters, a replica acting on none of them (its
    first pass: all another replica's), then on all of them: none of their objects is
    written. (Run with ``settle_bound=0``, i.e. planned at once, this test saw both
    K0sControlPlanes written.) The fleet-wide objects too (the rollout record, the
    FleetUpgrade status): another replica's cluster is judged by what its holder wrote
    into its MachineDeployment and K0sControlPlane, so a fleet never upgraded by k0s-fleet
    (no version recorded on its Machines) counts as up to date before and after the
    handover. (Judged from the Machines alone, it counted 1/3 nodes up to date, then 3/3
    once the nodes were seen: both objects were written.)"""
    await ensure_infra_crd(mgmt)
    fcs = [await small_cluster(mgmt, wl1, world, namespace, prefix="sh", control_planes=1,
                               workers=2, version=V1) for _ in range(2)]
    await apply_upgrade(mgmt, namespace=namespace, name="steady", version=V1, selector=None)
    cfg = intent_config(namespace)

    async with policy_controller(mgmt, cfg) as first:
        await wait_for("the first controller's status written",
                       lambda: all_up_to_date(mgmt, fcs), 120, 0.1)
        await wait_for("the first controller quiet", lambda: quiet(first), 60, 0.1)

    shard = Toggle()
    async with policy_controller(mgmt, cfg, sharding=Sharding(shard)) as second:
        await wait_for("planned on nothing of its own, quiet", lambda: quiet(second), 120, 0.1)
        before = await versions(mgmt, wl1, namespace, fcs)
        planned = second.stats.clusters_planned
        shard.on = True
        second.trigger.poke()
        await wait_for("the taken-over clusters planned",
                       lambda: _planned(second, planned + len(fcs)), 120, 0.1)
        await wait_for("quiet again", lambda: quiet(second), 60, 0.1)
        assert all(second.registry.settled((namespace, fc.name)) for fc in fcs)
        after = await versions(mgmt, wl1, namespace, fcs)
    written = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert written == [], f"the replica wrote {written} on taking the clusters over"


async def _planned(ctl: FleetController, n: int) -> bool:
    return ctl.stats.clusters_planned >= n and not ctl.performer.inflight


async def test_the_first_pass_waits_its_bound_from_when_the_clusters_were_asked_for(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    """The first pass waits for every workload cluster's first answer at most
    ``settle_bound`` seconds, counted from when the clusters were asked for (the first
    pass, once the management caches synced), not from the controller's start. Here the
    management list of Clusters is answered only after longer than the bound, and the
    workload cluster never answers: counted from the start (as before), the bound was
    spent before the cluster was even asked for, and its first pass planned it at once,
    from an empty cache."""
    await ensure_infra_crd(mgmt)
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="sb", control_planes=1,
                             workers=1, version=V1)
    key = (namespace, fc.name)
    bound = 6.0
    released: list[float] = []  # monotonic: when the management list of Clusters was sent

    async def slow_cluster_list(method: str, path: str) -> None:
        if not released and method == "GET" and path.endswith(f"/{resources.CLUSTERS.plural}"):
            await anyio.sleep(bound + 3)
            released.append(time.monotonic())

    async def silent_workload(method: str, path: str) -> None:
        await anyio.sleep_forever()  # its Nodes never listed: never settled

    # (monotonic, whether the pass saw the cluster's Nodes)
    first_pass: list[tuple[float, bool]] = []

    def on_pass(snapshot: Snapshot, _: Any) -> None:
        if not first_pass:
            first_pass.append((time.monotonic(), snapshot.nodes.get(key) is not None))

    async with running_controller(
            hooked(mgmt, slow_cluster_list), intent_config(namespace),
            tuning=tuning(settle_bound=bound), client_factory=hooked_factory(silent_workload),
            on_pass=on_pass) as ctl:
        await wait_for("the first pass", lambda: _now(bool(first_pass)), 120, 0.1)
        assert released, "the management list of Clusters was never asked for"
        at, seen = first_pass[0]
        # planned without the cluster's answer, once the bound had passed since the
        # cluster was asked for (after the Clusters were listed)
        assert not seen and not ctl.registry.settled(key)
        assert at - released[0] >= bound, f"planned {at - released[0]:.1f}s after asking"
        assert ctl.stats.clusters_planned >= 1


async def _now(value: bool) -> bool:
    return value
