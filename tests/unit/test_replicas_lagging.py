"""Sharded replicas whose FleetUpgrade watches trail the rollout record never exceed
maxConcurrentClusters together (fleet/rollout/gate.py, the pure gate; no server).

A small model of the fleet: clusters owned by two replicas, each given a new target by a
FleetUpgrade at some point. Each replica sees the FleetUpgrades in order but late (its
own prefix of them), while it reads the rollout record up to date (the adversarial case:
the record's watch ahead of the FleetUpgrades'). A replica's evaluation is written back
by compare-and-swap, as the coordinator does; an admission it wins starts its cluster.
Whatever the interleaving, the clusters started and not finished are never more than the
limit. The gate before f8fdd8b broke it (a replica that had not seen another one's
target yet took that cluster for complete and admitted its own).
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import ClusterProgress
from fleet.rollout.state import RolloutState
from tests.helpers.gate import T0, behind, cluster, config

LIMIT = 1
CLUSTERS = 4
OWNER = {f"c{i}": i % 2 for i in range(CLUSTERS)}


class Fleet:
    def __init__(self) -> None:
        self.upgrades: list[str] = []  # clusters given the new target, in order
        self.seen = [0, 0]  # per replica: how many of them it has seen
        self.state = RolloutState()
        self.version = 0  # the record's resourceVersion
        self.started: set[str] = set()
        self.done: set[str] = set()
        self.gates = [RolloutGate(config(maxConcurrentClusters=LIMIT)) for _ in (0, 1)]
        self.most = 0

    def view(self, replica: int) -> list[ClusterProgress]:
        known = set(self.upgrades[:self.seen[replica]])
        out = []
        for name, owner in sorted(OWNER.items()):
            if name in self.done:
                c = cluster(name, "uu")
            elif name in self.started:
                c = cluster(name, "gw")
            else:
                c = cluster(name, "ww")
            if name not in known:
                c = behind(c)
            out.append(dataclasses.replace(c, foreign=owner != replica))
        return out

    def evaluate(self, replica: int) -> None:
        read = self.version
        d = self.gates[replica].evaluate(
            FleetView(self.view(replica), state=self.state, fleet_writer=replica == 0), T0)
        if d.state_changed:
            assert read == self.version  # nothing else ran in between: the swap holds
            self.state, self.version = d.state, self.version + 1
        for key in d.admitted_now:
            self.started.add(key[1])
        self.most = max(self.most, len(self.started - self.done))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["upgrade", "see", "evaluate", "finish"]),
                          st.integers(0, 1), st.integers(0, CLUSTERS - 1)), max_size=40))
def test_replicas_behind_on_fleetupgrades_stay_within_the_limit_together(
        steps: list[tuple[str, int, int]]) -> None:
    f = Fleet()
    for what, replica, i in steps:
        name = f"c{i}"
        if what == "upgrade" and name not in f.upgrades:
            f.upgrades.append(name)
        elif what == "see":
            f.seen[replica] = min(len(f.upgrades), f.seen[replica] + 1)
        elif what == "evaluate":
            f.evaluate(replica)
        elif what == "finish" and name in f.started:
            f.done.add(name)
        assert f.most <= LIMIT, (f.started - f.done, f.state.admitted)
    # Caught up, each replica in turn: every upgraded cluster goes, one at a time.
    f.seen = [len(f.upgrades)] * 2
    for _ in range(3 * CLUSTERS):
        for replica in (0, 1):
            f.evaluate(replica)
        f.done |= f.started
    assert f.most <= LIMIT
    assert f.done >= set(f.upgrades)
