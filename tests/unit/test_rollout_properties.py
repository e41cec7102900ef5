"""Property tests of the wave engine: random fleets, wave configs, progress, failures,
lost state writes and clock jumps. After every gate evaluation an oracle that knows only
the simulated world checks:

* never more than maxConcurrentClusters clusters of a wave are allowed, nor upgrading;
* no cluster of wave N+1 starts before every earlier wave is complete and soaked (soak
  counted from the first moment the oracle itself saw the wave complete);
* a failed canary cluster means nothing is allowed anywhere; so does an exceeded budget;
* without failures the rollout finishes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.config.models import FleetConfig
from fleet.rollout.gate import FleetView, GateDecision, RolloutGate
from fleet.rollout.progress import ClusterProgress, NodeProgress, NodeState, ObjectProgress
from fleet.rollout.state import RolloutState
from fleet.world.model import ObjectRef
from tests.helpers.gate import CANARY, PROD, T0, TARGET, config

_LETTER = {"w": NodeState.WAITING, "g": NodeState.UPGRADING, "u": NodeState.UP_TO_DATE,
           "f": NodeState.FAILED}


@dataclass
class SimCluster:
    name: str
    labels: dict[str, str]
    nodes: list[str]  # letters as in _LETTER
    started: bool = False

    def progress(self) -> ClusterProgress:
        obj = ObjectProgress(
            ref=ObjectRef("MachineDeployment", "fleet", f"{self.name}-md"), target=TARGET,
            replicas=len(self.nodes), started=self.started,
            nodes=tuple(NodeProgress(f"{self.name}-{i}", f"{self.name}-{i}", _LETTER[s])
                        for i, s in enumerate(self.nodes)))
        return ClusterProgress("fleet", self.name, labels=self.labels, objects=(obj,))

    @property
    def complete(self) -> bool:
        return all(s == "u" for s in self.nodes)

    @property
    def failed(self) -> bool:
        return "f" in self.nodes


@dataclass
class Sim:
    cfg: FleetConfig
    clusters: list[SimCluster]
    now: datetime = T0
    state: RolloutState = field(default_factory=RolloutState)
    first_complete: dict[str, datetime] = field(default_factory=dict)

    def wave_of(self, c: SimCluster) -> str:
        return self.cfg.for_cluster("fleet", c.name, c.labels).wave.name

    def evaluate(self, persisted: bool) -> GateDecision:
        d = RolloutGate(self.cfg).evaluate(
            FleetView([c.progress() for c in self.clusters], state=self.state), self.now)
        if persisted:
            self.state = d.state
        else:
            d = d.without_new_admissions()
        return d

    def check(self, d: GateDecision) -> None:
        waves = self.cfg.rollout.effective_waves
        for w in waves:
            members = [c for c in self.clusters if self.wave_of(c) == w.name]
            if members and all(c.complete for c in members):
                self.first_complete.setdefault(w.name, self.now)
        for w in waves:
            limit = self.cfg.rollout.concurrency(w)
            members = [c for c in self.clusters if self.wave_of(c) == w.name]
            allowed = [c for c in members if ("fleet", c.name) in d.allowed_clusters]
            assert len(allowed) <= limit, (w.name, [c.name for c in allowed])
            upgrading = [c for c in members
                         if (c.started or ("fleet", c.name) in d.allowed_clusters)
                         and not c.complete and not c.failed]
            assert len(upgrading) <= limit, (w.name, [c.name for c in upgrading])
            failed = [c for c in members if c.failed]
            if len(failed) > w.tolerated_failures(len(members)):
                assert not d.allowed_clusters
                assert d.halted is not None
            if w.canary and failed:
                assert not d.allowed_clusters

    def start(self, d: GateDecision, how_many: int) -> None:
        waves = [w.name for w in self.cfg.rollout.effective_waves]
        for c in self.clusters:
            if ("fleet", c.name) not in d.allowed_clusters or "w" not in c.nodes:
                continue
            if not c.started:
                # Wave order and soak, from the oracle's own observations.
                mine = waves.index(self.wave_of(c))
                for w in self.cfg.rollout.effective_waves[:mine]:
                    members = [x for x in self.clusters if self.wave_of(x) == w.name]
                    if not members:
                        continue
                    assert all(x.complete for x in members), (c.name, w.name)
                    assert self.now >= self.first_complete[w.name] + w.soak, (c.name, w.name)
            for _ in range(how_many):
                if "w" in c.nodes:
                    c.nodes[c.nodes.index("w")] = "g"
                    c.started = True


def _fleet(draw: Callable[[st.SearchStrategy[Any]], Any]) -> Sim:
    n = draw(st.integers(1, 7))
    rings = draw(st.lists(st.sampled_from(["canary", "prod", "none"]), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    soak = st.sampled_from(["0s", "5m", "30m"])
    cfg = config(
        maxConcurrentClusters=draw(st.integers(1, 3)),
        waves=[
            {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
             "maxConcurrentClusters": draw(st.integers(1, 2)), "soakSeconds": draw(soak)},
            {"name": "prod", "clusterSelector": {"matchLabels": PROD},
             "maxConcurrentClusters": draw(st.integers(1, 3)), "soakSeconds": draw(soak),
             "failureBudget": draw(st.sampled_from([0, 1, "50%"]))},
        ])
    clusters = [SimCluster(f"c{i}", {"canary": CANARY, "prod": PROD, "none": {}}[r],
                           ["w"] * s) for i, (r, s) in enumerate(zip(rings, sizes, strict=True))]
    return Sim(cfg, clusters)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_wave_invariants_hold_under_random_progress(data: st.DataObject) -> None:
    sim = _fleet(data.draw)
    fail_rate = data.draw(st.sampled_from([0.0, 0.0, 0.1, 0.3]))
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    for _ in range(data.draw(st.integers(1, 40))):
        d = sim.evaluate(persisted=rnd.random() < 0.8)
        sim.check(d)
        sim.start(d, rnd.randint(0, 2))
        for c in sim.clusters:
            for i, s in enumerate(c.nodes):
                if s == "g" and rnd.random() < 0.5:
                    c.nodes[i] = "f" if rnd.random() < fail_rate else "u"
        sim.now += timedelta(seconds=rnd.choice([0, 1, 60, 299, 600, 1799, 3600]))

    # Heal: no more failures; without any failure so far, everything must finish.
    any_failed = any(c.failed for c in sim.clusters)
    for _ in range(20 if any_failed else 200):
        d = sim.evaluate(persisted=True)
        sim.check(d)
        sim.start(d, 3)
        for c in sim.clusters:
            c.nodes = ["u" if s == "g" else s for s in c.nodes]
        if all(c.complete for c in sim.clusters):
            break
        sim.now += timedelta(minutes=10)
    if not any_failed:
        assert all(c.complete for c in sim.clusters)
