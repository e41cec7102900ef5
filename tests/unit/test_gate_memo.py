"""The wave gate's per-cluster memo decides as a fresh gate does.

The controller keeps each cluster's progress as the same object until the cluster moves
(``ProgressMemo``) and one gate for its life, which remembers per progress object what it
derived (fingerprint, completeness, settings, pause) and per wave its fingerprint. Over
random progress, failures, clock jumps and lost state writes (the fleets of
test_rollout_properties), a long-lived gate fed with reused progress objects must give
exactly the decision of a fresh gate fed with freshly built ones.
"""

from __future__ import annotations

import random
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import ClusterProgress
from tests.unit.test_rollout_properties import _fleet


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_remembering_gate_decides_as_a_fresh_one(data: st.DataObject) -> None:
    sim = _fleet(data.draw)
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    gate = RolloutGate(sim.cfg)
    kept: dict[str, tuple[tuple[tuple[str, ...], bool], ClusterProgress]] = {}
    reused = 0

    def progress() -> list[ClusterProgress]:
        nonlocal reused
        out = []
        for c in sim.clusters:
            key = (tuple(c.nodes), c.started)
            hit = kept.get(c.name)
            if hit is None or hit[0] != key:
                hit = kept[c.name] = (key, c.progress())
            else:
                reused += 1
            out.append(hit[1])
        return out

    for _ in range(data.draw(st.integers(1, 40))):
        view = FleetView(progress(), state=sim.state)
        fresh = FleetView([c.progress() for c in sim.clusters], state=sim.state)
        d = gate.evaluate(view, sim.now)
        assert d == RolloutGate(sim.cfg).evaluate(fresh, sim.now)
        sim.check(d)
        if rnd.random() < 0.8:
            sim.state = d.state
        sim.start(d, rnd.randint(0, 2))
        for c in sim.clusters:
            for i, s in enumerate(c.nodes):
                if s == "g" and rnd.random() < 0.5:
                    c.nodes[i] = "f" if rnd.random() < 0.1 else "u"
        sim.now += timedelta(seconds=rnd.choice([0, 1, 60, 299, 600, 1799, 3600]))
