"""Sharding across controller replicas, the pure parts: rendezvous assignment of shards,
names, and the fleet gate as one replica among several sees it (no server)."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from datetime import timedelta

import pytest

from fleet.controllers.shard import (
    assignment,
    member_lease_name,
    rendezvous_owner,
    shard_lease_name,
    shard_of,
)
from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import ClearSignal, UncordonNode
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FOREIGN, ClusterPhase, FleetView, RolloutGate, WavePhase
from fleet.rollout.progress import ClusterProgress, clusters_from_snapshot
from fleet.rollout.state import RolloutState
from fleet.world.snapshot import restrict
from tests.helpers.gate import CANARY, PROD, T0, behind, cluster, config, waves_config

MEMBERS = ["ctl-a", "ctl-b", "ctl-c"]
V2 = "v1.31.3+k0s.0"


def test_every_replica_computes_the_same_owner_and_shares_are_balanced() -> None:
    owners = assignment(300, MEMBERS)
    assert owners == assignment(300, list(reversed(MEMBERS)))  # order does not matter
    assert set(owners) == set(range(300))
    counts = Counter(owners.values())
    assert set(counts) == set(MEMBERS)
    assert all(60 <= n <= 140 for n in counts.values()), counts
    assert assignment(10, []) == {}
    assert rendezvous_owner("x", []) is None


def test_losing_a_replica_moves_only_its_shards_and_a_new_one_only_takes() -> None:
    before = assignment(256, MEMBERS)
    after = assignment(256, ["ctl-a", "ctl-c"])
    moved = {s for s in before if before[s] != after[s]}
    assert moved == {s for s, o in before.items() if o == "ctl-b"}
    grown = assignment(256, [*MEMBERS, "ctl-d"])
    changed = {s for s in before if before[s] != grown[s]}
    assert changed and all(grown[s] == "ctl-d" for s in changed)


def test_shard_of_is_stable_and_in_range() -> None:
    keys = [("fleet", f"c{i}") for i in range(500)]
    shards = [shard_of(k, 16) for k in keys]
    assert shards == [shard_of(k, 16) for k in keys]
    assert set(shards) == set(range(16))
    assert shard_of(("fleet", "c1"), 1) == 0


def test_lease_names_are_valid_and_distinct() -> None:
    dns = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    names = {member_lease_name("k0s-fleet-controller", i)
             for i in ("ctl-0", "Ctl_0", "ctl.0", "x" * 300, "ctl-0-")}
    assert len(names) == 5
    assert all(dns.match(n) and len(n) <= 253 for n in names)
    assert member_lease_name("g", "pod-7") == "g-replica-pod-7"
    assert shard_lease_name("g", 3) == "g-shard-3"


def _foreign(c: ClusterProgress) -> ClusterProgress:
    return dataclasses.replace(c, foreign=True)


def test_foreign_clusters_count_against_the_limit_but_are_never_admitted_here() -> None:
    cfg = config(maxConcurrentClusters=2)
    # c0 upgrades on another replica, c1 waits on another replica, c2/c3 are ours.
    cs = [_foreign(cluster("c0", "gw")), _foreign(cluster("c1")), cluster("c2"), cluster("c3")]
    d = RolloutGate(cfg).evaluate(FleetView(cs), T0)
    assert d.admitted_now == {("fleet", "c2")}
    assert d.allowed_clusters == {("fleet", "c2")}
    assert d.reasons[("fleet", "c1")] == FOREIGN
    assert d.reasons[("fleet", "c0")] == FOREIGN
    assert "maxConcurrentClusters 2 clusters upgrading" in d.reasons[("fleet", "c3")]
    assert d.clusters[("fleet", "c0")].foreign and not d.clusters[("fleet", "c2")].foreign


def test_only_its_own_replica_drops_a_complete_clusters_admission() -> None:
    """When c0 completes, every replica sees it; the record's admission of c0 is dropped
    by c0's replica only. Before, every replica dropped it: each one rewrote the record,
    one write landed and the others got 409 (10 replicas: 9 conflicts per completion,
    each conflicting write withdrawing what it had admitted with it; bench/README.md
    "Why the sharded rollout crawled"). A complete cluster holds no slot either way."""
    cfg = config(maxConcurrentClusters=2)
    holder = RolloutGate(cfg)
    other = RolloutGate(cfg)
    d = holder.evaluate(FleetView([cluster("c0"), _foreign(cluster("c1"))]), T0)
    assert d.admitted_now == {("fleet", "c0")}
    record = d.state
    done = cluster("c0", "uu")
    # another replica (not the fleet-wide writer; c1 is its own, every node in flight):
    # c0 is complete, and it has nothing to write
    seen = other.evaluate(FleetView([_foreign(done), cluster("c1", "gg")], state=record,
                                    fleet_writer=False), T0)
    assert not seen.state_changed
    assert seen.clusters[("fleet", "c0")].phase is ClusterPhase.COMPLETE
    assert seen.allowed_clusters == {("fleet", "c1")}
    # its own replica drops it (and so the completion is reported once, by it)
    mine = holder.evaluate(FleetView([done, _foreign(cluster("c1", "gg"))], state=record), T0)
    assert mine.state_changed and "fleet/c0" not in mine.state.admitted

def test_two_replicas_deciding_from_one_record_exceed_the_limit_unless_swapped() -> None:
    """Why admission must be a compare-and-swap of the record: each replica alone stays
    within the limit; from the same record together they do not. The coordinator writes
    a record only if it is still the one decided from (tests/integration/test_shard.py
    shows the 409 path on a real server)."""
    cfg = config(maxConcurrentClusters=1)
    a = [cluster("c0"), _foreign(cluster("c1"))]
    b = [_foreign(cluster("c0")), cluster("c1")]
    da = RolloutGate(cfg).evaluate(FleetView(a), T0)
    db = RolloutGate(cfg).evaluate(FleetView(b), T0)
    assert da.admitted_now == {("fleet", "c0")} and db.admitted_now == {("fleet", "c1")}
    # b re-decides from a's record (its swap failed): nothing more is admitted.
    db2 = RolloutGate(cfg).evaluate(FleetView(b, state=da.state), T0)
    assert db2.admitted_now == frozenset()
    assert db2.allowed_clusters == frozenset()


def test_only_the_fleet_writer_moves_wave_times_and_the_others_wait_for_them() -> None:
    cfg = waves_config()
    cs = [_foreign(cluster("can", "uu", labels=CANARY)), cluster("p1", labels=PROD)]
    running = [_foreign(cluster("can", "ug", labels=CANARY)), cluster("p1", labels=PROD)]
    before = RolloutGate(cfg).evaluate(FleetView(running, fleet_writer=False), T0)
    other = RolloutGate(cfg).evaluate(FleetView(cs, fleet_writer=False), T0)
    assert other.state.waves == {}
    assert other.waves[0].phase is WavePhase.PROGRESSING
    assert other.waves[0].message == "complete; waiting for the completion to be recorded"
    # Issue #13 target 2: the held cluster's reason (its MD and KCP status) is the one it
    # had while the wave ran, not a new one for the wait for the record ("wave canary:
    # completion not recorded yet" was two more status writes per held cluster of every
    # replica but the fleet writer, at each wave's completion).
    assert other.reasons[("fleet", "p1")] == before.reasons[("fleet", "p1")] == (
        "waiting for wave canary to complete")
    assert other.allowed_clusters == frozenset()
    writer = RolloutGate(cfg).evaluate(FleetView(cs), T0)
    assert writer.waves[0].completed_at == T0
    # Once recorded, the other replica soaks from the record and then admits its cluster.
    later = RolloutGate(cfg).evaluate(FleetView(cs, state=writer.state, fleet_writer=False),
                                      T0 + timedelta(minutes=30))
    assert later.allowed_clusters == {("fleet", "p1")}
    assert later.state.waves == writer.state.waves
    assert later.state.admitted.keys() == {"fleet/p1"}


@pytest.mark.parametrize("writer", [True, False])
def test_a_failed_foreign_cluster_halts_every_replica(writer: bool) -> None:
    cfg = waves_config()
    cs = [_foreign(cluster("can", "fu", labels=CANARY)), cluster("p1", labels=PROD),
          cluster("o")]
    d = RolloutGate(cfg).evaluate(FleetView(cs, fleet_writer=writer), T0)
    assert d.halted is not None and d.allowed_clusters == frozenset()
    assert d.clusters[("fleet", "can")].phase is ClusterPhase.FAILED
    assert (d.state.halted is not None) is writer


def test_a_non_writer_leaves_the_fleet_transitions_alone() -> None:
    state = RolloutState()
    d = RolloutGate(config(paused=True)).evaluate(
        FleetView([cluster("c0")], state=state, fleet_writer=False), T0)
    assert d.paused is not None and d.state.paused is None and not d.state_changed


def test_a_foreign_cluster_is_judged_by_its_nodeplans_and_machine_records() -> None:
    """A replica does not watch the Nodes of clusters other replicas act on; the versions
    the acting replica records on Machines (only after a node is Ready on target) and the
    NodePlans in the management cluster tell the gate how far such a cluster is."""
    sim = SimFleet(now=T0)
    key = add_cluster(sim, "c", namespace="fleet", control_planes=1, workers=2)
    bump(sim, key, V2)

    def seen_from_elsewhere() -> ClusterProgress:
        snap = sim.snapshot()
        snap = dataclasses.replace(snap, nodes={**snap.nodes, key: None},
                                   foreign=frozenset({key}))
        [progress] = clusters_from_snapshot(snap)
        return progress

    p = seen_from_elsewhere()
    assert p.foreign and p.observed and not p.complete and not p.started
    unseen = dataclasses.replace(sim.snapshot(), nodes={key: None})
    assert not clusters_from_snapshot(unseen)[0].observed  # not foreign: not observed
    for _ in range(200):  # run the planner (the acting replica) until every node is done
        for ckey, node in sim.active_requests():
            sim.finish_node(ckey, node)
        actions = plan(sim.snapshot(), PlannerSettings()).actions
        if not actions:
            break
        sim.apply_all(actions)
        sim.advance(1)
        p = seen_from_elsewhere()
        assert p.started or p.in_flight == 0
    assert clusters_from_snapshot(sim.snapshot())[0].complete
    assert seen_from_elsewhere().complete


def test_a_shard_leaves_other_clusters_requests_alone_on_a_shared_node_list() -> None:
    """The planner of one shard sees only its clusters' NodePlans; a request on a node it
    happens to see (the test world shares a workload API server between clusters) that
    names a NodePlan of a cluster left out is not an orphan: not cleared, not uncordoned."""
    sim = SimFleet(now=T0)
    a = add_cluster(sim, "a", namespace="fleet", control_planes=1, workers=1)
    b = add_cluster(sim, "b", namespace="fleet", control_planes=1, workers=1)
    bump(sim, b, V2)
    for _ in range(5):
        sim.apply_all(plan(sim.snapshot(), PlannerSettings()).actions)
    assert sim.active_requests(), "b has a node with a live request"
    full = sim.snapshot()
    ours = restrict(full, {a})
    assert set(ours.clusters) == {a} and all(p.cluster == "a" for p in ours.nodeplans.values())
    assert ours.other_nodeplans == frozenset(full.nodeplans) - set(ours.nodeplans)
    shared = {**(ours.nodes[a] or {}), **(full.nodes[b] or {})}
    seen = dataclasses.replace(ours, nodes={a: shared})
    actions = plan(seen, PlannerSettings()).actions
    assert not [x for x in actions if isinstance(x, ClearSignal | UncordonNode)], actions
    # Without the ids of the plans left out, the same request would be taken for an orphan.
    blind = dataclasses.replace(seen, other_nodeplans=frozenset())
    assert [x for x in plan(blind, PlannerSettings()).actions if isinstance(x, ClearSignal)]


def test_an_admission_for_targets_this_replica_has_not_seen_yet_holds_its_slot() -> None:
    """Replica a saw c0's new target and admitted it; replica b's watch of FleetUpgrades
    has not delivered it yet (the rollout record's watch is another stream), so to b c0
    is at its old target, complete, and a's admission is for targets b does not know.
    b must count c0 against the limit and keep a's admission in the record it writes.
    Before, b took c0 for complete, admitted its own c1 over the limit, and dropped c0's
    admission from the record (a fresh-clone CI saw 3 clusters upgrading at once with a
    limit of 2 in tests/integration/test_shard_failover.py)."""
    cfg = config(maxConcurrentClusters=1)
    da = RolloutGate(cfg).evaluate(FleetView([cluster("c0"), _foreign(cluster("c1"))]), T0)
    assert da.admitted_now == {("fleet", "c0")}
    b = RolloutGate(cfg)
    db = b.evaluate(FleetView([_foreign(behind(cluster("c0"))), cluster("c1")],
                              state=da.state, fleet_writer=False), T0)
    assert db.admitted_now == frozenset() and db.allowed_clusters == frozenset()
    assert db.clusters[("fleet", "c0")].phase is ClusterPhase.UPGRADING
    assert db.state.admitted == da.state.admitted
    # Caught up: the same; and once c0's own replica dropped it (complete), c1 goes.
    db = b.evaluate(FleetView([_foreign(cluster("c0", "gw")), cluster("c1")],
                              state=da.state, fleet_writer=False), T0)
    assert db.allowed_clusters == frozenset()
    done = RolloutGate(cfg).evaluate(FleetView([cluster("c0", "uu"), _foreign(cluster("c1"))],
                                               state=da.state), T0)
    assert "fleet/c0" not in done.state.admitted
    db = b.evaluate(FleetView([_foreign(cluster("c0", "uu")), cluster("c1")],
                              state=done.state, fleet_writer=False), T0)
    assert db.admitted_now == {("fleet", "c1")}


def test_its_own_replica_drops_an_admission_for_targets_no_longer_wanted() -> None:
    """The owner of c0 admitted it for a target since replaced: it drops that admission
    (and may admit c0 again for the new one); another replica keeps it meanwhile."""
    cfg = config(maxConcurrentClusters=1)
    first = RolloutGate(cfg).evaluate(FleetView([cluster("c0"), _foreign(cluster("c1"))]), T0)
    moved = dataclasses.replace(cluster("c0"), objects=tuple(
        dataclasses.replace(o, target="v1.32.0+k0s.0") for o in cluster("c0").objects))
    again = RolloutGate(cfg).evaluate(FleetView([moved, _foreign(cluster("c1"))],
                                                state=first.state), T0)
    assert again.state.admitted["fleet/c0"] != first.state.admitted["fleet/c0"]
    other = RolloutGate(cfg).evaluate(FleetView([_foreign(moved), cluster("c1")],
                                                state=first.state, fleet_writer=False), T0)
    assert other.state.admitted == first.state.admitted and not other.allowed_clusters
