"""A sharded replica keeps little of the clusters it does not hold, and reads them again
in full before acting on one it takes (issue #13 target 2, fleet/world/kept.py FOREIGN_SPECS).

Two CAPI clusters on the real test world (workload API server ``wl1``), one in-process
controller whose shard claims the test moves by hand (:class:`Claims`, the part of
:class:`fleet.controllers.shard.ShardMembership` the controller reads). Of a cluster it
does not hold the caches keep a kubeconfig Secret without its kubeconfig and Machines
without uid or infrastructure reference: what a NodePlan (its Machine owner reference,
by uid) and the workload connection (the kubeconfig) need. Taking one of them re-reads
them (``ShardTakeover.warm_taken``), after which it is rolled to a new version, every node once;
giving it back keeps the foreign subset again; taken again, its NodePlans are read into
the cache (not waited for from the watch); taking it again through the bulk re-read
(one list of everything, as at a replica's start-up) reads it in full again. The other
cluster stays foreign throughout.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from fleet.config.models import FleetConfig
from fleet.controllers.takeover import Sharding
from fleet.kube import KubeClient
from fleet.kube.resources import MACHINES, NODE_PLANS, SECRETS
from fleet.testing.capi import FleetCluster, bump, ensure_infra_crd
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from fleet.world.model import ClusterKey
from tests.helpers.capienv import wait_for
from tests.helpers.controller import (
    V1,
    V2,
    fleet_config_dict,
    machine_versions,
    policy_controller,
    small_cluster,
    wait_rollout,
)

pytestmark = pytest.mark.anyio


class Claims:
    """Which clusters' shard claims this replica holds, and which of them are warming
    (taken, not acted on yet)."""

    def __init__(self) -> None:
        self.held: set[ClusterKey] = set()
        self.warming: set[ClusterKey] = set()
        self.readying: set[ClusterKey] = set()  # may be taken soon: read ahead
        self.epoch: dict[ClusterKey, int] = {}  # times it began to be kept in full

    def ready(self, cluster: ClusterKey, on: bool = True) -> None:
        if on and not self.keeps_full(cluster):
            self.epoch[cluster] = self.epoch.get(cluster, 0) + 1
        (self.readying.add if on else self.readying.discard)(cluster)

    def keeps_full(self, cluster: ClusterKey) -> bool:
        return cluster in self.held or cluster in self.readying

    def kept_since(self, cluster: ClusterKey) -> int:
        return self.epoch.get(cluster, 0)

    def acts_on(self, cluster: ClusterKey) -> bool:
        return cluster in self.held and cluster not in self.warming

    def claims(self, cluster: ClusterKey) -> bool:
        return cluster in self.held

    def warming_cluster(self, cluster: ClusterKey) -> bool:
        return cluster in self.warming


def kubeconfig_kept(ctl: Any, fc: FleetCluster) -> bool:
    secret = ctl.view[SECRETS].get(f"{fc.name}-kubeconfig", fc.namespace)
    assert secret is not None, "the kubeconfig Secret is cached (its name, labels)"
    return "value" in (secret.get("stringData") or {})


def machines_kept(ctl: Any, fc: FleetCluster) -> list[bool]:
    """Per Machine of ``fc``: whether its uid and infrastructure reference are kept."""
    out = []
    for name in fc.machines:
        m = ctl.view[MACHINES].get(name, fc.namespace)
        assert m is not None, f"Machine {name} is cached"
        out.append(bool(m["metadata"].get("uid")) and "infrastructureRef" in m["spec"])
    return out


async def test_a_taken_cluster_is_read_again_in_full_and_rolled(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    taken, other, cfg = await _two_clusters(world, mgmt, wl1, namespace, "sc", workers=2)
    claims = Claims()
    responder = NodeResponder(wl1, step_seconds=0.05, only=lambda n: n in taken.machines)
    async with policy_controller(mgmt, cfg, sharding=Sharding(claims, claims.claims)) as ctl:
        # Held by no one here: the foreign subset only.
        for fc in (taken, other):
            assert not kubeconfig_kept(ctl, fc)
            assert machines_kept(ctl, fc) == [False] * len(fc.machines)
        claims.held.add(taken.key)
        claims.warming.add(taken.key)
        # Claimed, not yet read again: what was dropped is still missing (the watch has
        # no reason to send it), which is why the shard is not acted on yet.
        assert not kubeconfig_kept(ctl, taken)
        await wait_for("the taken shard warm (its clusters read again)",
                       lambda: ctl.takeover.warm_taken(claims.warming_cluster), 60, 0.2)
        assert kubeconfig_kept(ctl, taken)
        assert machines_kept(ctl, taken) == [True] * len(taken.machines)
        assert not kubeconfig_kept(ctl, other)
        assert machines_kept(ctl, other) == [False] * len(other.machines)
        # Connected while it warmed up (as soon as its kubeconfig was read), not once it is
        # acted on: its Nodes are listed by then. Passes while it warms keep the client.
        assert ctl.registry.get(taken.key) is not None
        assert ctl.registry.get(other.key) is None
        await wait_for("the warming cluster's Nodes listed",
                       _async(lambda: ctl.registry.settled(taken.key)), 60, 0.1)
        await _one_pass(ctl)
        wc = ctl.registry.get(taken.key)
        assert wc is not None and ctl.registry.settled(taken.key)
        claims.warming.clear()
        ctl.trigger.poke()
        async with responder_running(responder):
            await bump(mgmt, taken, V2)
            await wait_rollout(mgmt, taken, timeout=240)
        # Every NodePlan of the taken cluster names its Machine by the uid the server has.
        uids = {m["metadata"]["name"]: m["metadata"]["uid"]
                for m in (await mgmt.list(MACHINES, namespace)).items}
        plans = [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
                 if p["spec"]["machineName"] in taken.machines]
        assert sorted(p["spec"]["machineName"] for p in plans) == sorted(taken.machines)
        for p in plans:
            (owner,) = p["metadata"]["ownerReferences"]
            assert owner["uid"] == uids[p["spec"]["machineName"]], p["metadata"]["name"]
        # The other cluster (held by no one, nothing asked of it) was not touched.
        assert {v for m, v in (await machine_versions(mgmt, other)).items()
                if m in other.machines} == {V1}
        # Given back and taken again, its NodePlans not (yet) in this replica's cache, as
        # when the NodePlan watch has not delivered what the previous holder dispatched:
        # the warm-up reads them in (before, it waited for the watch to deliver them,
        # here forever; mid-roll, minutes).
        await _give_back_and_take_again(ctl, claims, taken)
        # Given back, its client went with it; taken again, none until it is read again.
        assert ctl.registry.get(taken.key) is None
        ctl.view[NODE_PLANS].clear()
        await wait_for("the taken shard warm (its NodePlans read)",
                       lambda: ctl.takeover.warm_taken(claims.warming_cluster), 60, 0.2)
        assert _cached_plans(ctl, namespace) == {p["metadata"]["name"] for p in plans}
        claims.warming.clear()
        # Given back: projected down again once a pass sees it.
        await _give_back_and_take_again(ctl, claims, taken)
        # Taken again, with many clusters at once (as at start-up): one list of every
        # Machine and Secret; only the held cluster's are kept in full.
        ctl.takeover.reread_bulk = 0
        assert not kubeconfig_kept(ctl, taken)
        await wait_for("the taken shard warm (its clusters read again)",
                       lambda: ctl.takeover.warm_taken(claims.warming_cluster), 60, 0.2)
        assert kubeconfig_kept(ctl, taken)
        assert machines_kept(ctl, taken) == [True] * len(taken.machines)
        assert not kubeconfig_kept(ctl, other)
        assert machines_kept(ctl, other) == [False] * len(other.machines)
        assert _cached_plans(ctl, namespace) == {p["metadata"]["name"] for p in plans}
        # Given back, then taken again by a start-up whose every look is cut off after
        # one more page (the claims task bounds each look; under load the whole list
        # takes longer): the pages read stay read, and the re-read ends.
        ctl.takeover.reread_page_size = 2
        await _give_back_and_take_again(ctl, claims, taken)
        ctl.view[NODE_PLANS].clear()
        looks = 0
        while not await _one_more_page_at_most(ctl, claims.warming_cluster):
            looks += 1
            assert looks < 60, "the re-read never ends when cut off after every page"
        assert looks >= 2  # really cut off: more than one look
        assert kubeconfig_kept(ctl, taken)
        assert machines_kept(ctl, taken) == [True] * len(taken.machines)
        assert machines_kept(ctl, other) == [False] * len(other.machines)
        assert _cached_plans(ctl, namespace) == {p["metadata"]["name"] for p in plans}


async def _two_clusters(world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str,
                        prefix: str, *, workers: int
                        ) -> tuple[FleetCluster, FleetCluster, FleetConfig]:
    """Two small clusters at V1 on ``wl1`` and a fleet that may roll both at once."""
    await ensure_infra_crd(mgmt)
    one, two = [await small_cluster(mgmt, wl1, world, namespace, prefix=prefix,
                                    control_planes=1, workers=workers, version=V1)
                for _ in range(2)]
    cfg = FleetConfig.model_validate(fleet_config_dict(namespace, maxConcurrentClusters=2))
    return one, two, cfg


async def _one_pass(ctl: Any) -> None:
    """Poke the controller and wait until one more planning pass has run."""
    passes = ctl.stats.passes
    ctl.trigger.poke()
    await wait_for("a pass", _async(lambda: ctl.stats.passes > passes), 60, 0.05)


def _async(check: Any) -> Any:
    async def call() -> Any:
        return check()
    return call


def _cached_plans(ctl: Any, namespace: str) -> set[str]:
    return {p["metadata"]["name"] for p in ctl.view[NODE_PLANS].items()
            if p["metadata"]["namespace"] == namespace}


async def _give_back_and_take_again(ctl: Any, claims: Any, fc: FleetCluster) -> None:
    """Give the cluster's shard back, wait until a pass keeps it foreign again, then
    take it again (warming, not yet re-read)."""
    claims.held.clear()
    claims.warming.clear()
    ctl.trigger.poke()
    await wait_for("the given-back cluster kept foreign again",
                   lambda: _foreign_again(ctl, fc), 60, 0.1)
    claims.held.add(fc.key)
    claims.warming.add(fc.key)


async def _one_more_page_at_most(ctl: Any, taken: Any) -> bool:
    """One look at the taken shards, cut off as soon as it has read one more page of
    the bulk re-read: whether it completed."""
    before = ctl.takeover.bulk_pages_read
    done = False
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            async def look() -> None:
                nonlocal done
                done = await ctl.takeover.warm_taken(taken)
                tg.cancel_scope.cancel()

            tg.start_soon(look)
            while ctl.takeover.bulk_pages_read == before:
                await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
    return done


async def _foreign_again(ctl: Any, fc: FleetCluster) -> bool:
    return not kubeconfig_kept(ctl, fc) and not any(machines_kept(ctl, fc))


@contextlib.asynccontextmanager
async def responder_running(responder: NodeResponder) -> AsyncIterator[None]:
    """The node-agent stand-in answering for the duration of a block."""
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


async def test_a_cluster_that_may_be_taken_soon_is_read_ahead_and_let_go_if_not_taken(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    """Its holder missed a renewal (the membership's ``readying``): its Machines and
    kubeconfig are read in full and its workload cluster connected before any claim, and
    nothing is planned or written there. Not taken after all: kept foreign again and its
    connection closed. Taken: the warm-up after the take finds it connected and it is
    rolled, every node once."""
    ahead, other, cfg = await _two_clusters(world, mgmt, wl1, namespace, "ra", workers=1)
    claims = Claims()
    responder = NodeResponder(wl1, step_seconds=0.05, only=lambda n: n in ahead.machines)
    async with policy_controller(mgmt, cfg, sharding=Sharding(
            claims, claims.keeps_full, claims.kept_since)) as ctl:
        await bump(mgmt, ahead, V2)  # wanted already: only the claim is missing
        claims.ready(ahead.key)
        await ctl.takeover.read_ahead(lambda k: k in claims.readying)
        assert kubeconfig_kept(ctl, ahead)
        assert machines_kept(ctl, ahead) == [True] * len(ahead.machines)
        assert not kubeconfig_kept(ctl, other) and ctl.registry.get(other.key) is None
        await wait_for("the readying cluster's Nodes listed",
                       _async(lambda: ctl.registry.settled(ahead.key)), 60, 0.1)
        await _one_pass(ctl)
        assert ctl.registry.get(ahead.key) is not None  # the pass kept the connection
        assert await _plans_of(mgmt, ahead) == [], "nothing dispatched before a claim"
        # Not taken after all: projected down and disconnected by the next pass.
        claims.ready(ahead.key, False)
        ctl.trigger.poke()
        await wait_for("the cluster not taken kept foreign again",
                       lambda: _foreign_again(ctl, ahead), 60, 0.1)
        await wait_for("its connection closed",
                       _async(lambda: ctl.registry.get(ahead.key) is None), 60, 0.1)
        # Readying again, then taken: connected by the read-ahead, acted on once warm.
        claims.ready(ahead.key)
        await ctl.takeover.read_ahead(lambda k: k in claims.readying)
        assert ctl.registry.get(ahead.key) is not None
        claims.held.add(ahead.key)
        claims.warming.add(ahead.key)
        claims.ready(ahead.key, False)
        await wait_for("the taken shard warm",
                       lambda: ctl.takeover.warm_taken(claims.warming_cluster), 60, 0.2)
        assert kubeconfig_kept(ctl, ahead)
        claims.warming.clear()
        ctl.trigger.poke()
        async with responder_running(responder):
            await wait_rollout(mgmt, ahead, timeout=240)
        assert sorted(p["spec"]["machineName"] for p in await _plans_of(mgmt, ahead)) == \
            sorted(ahead.machines)
        assert {v for m, v in (await machine_versions(mgmt, other)).items()
                if m in other.machines} == {V1}


async def _plans_of(mgmt: KubeClient, fc: FleetCluster) -> list[dict[str, Any]]:
    return [p for p in (await mgmt.list(NODE_PLANS, fc.namespace)).items
            if p["spec"]["machineName"] in fc.machines]
