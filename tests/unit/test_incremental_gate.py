"""The incremental wave gate decides exactly as the gate that walks the whole fleet; the
progress memo lists what the whole snapshot gives.

The controller keeps one :class:`RolloutGate` for its life and gives it each cluster's
progress as the same object until the cluster moves; the gate keeps an index (per wave:
members, counts per phase, failing / upgrading / queued clusters, the verdicts of settled
clusters) and updates it only for the clusters that moved. Over random fleets and random
sequences of changes (node states, waves changed by labels, pauses of clusters and
objects, unreachable and foreign clusters, new targets, clusters joining and leaving,
records written, lost or edited by someone else, fleet pause and emergency stop,
maintenance windows, clock jumps, the fleet-wide writer changing), every decision of the
long-lived incremental gate must equal the one the reference gate (the walk over every
cluster the gate did before, tests/helpers/gate_reference.py) takes from scratch; and an
evaluation must judge again only the clusters that moved.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.config.models import FleetConfig
from fleet.planner import PlannerSettings, plan
from fleet.planner.incremental import Merger, merge, split
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.annotations import ANN_PAUSED
from fleet.rollout.gate import (
    DecisionHold,
    FleetControls,
    FleetView,
    GateDecision,
    RolloutGate,
)
from fleet.rollout.progress import (
    ClusterProgress,
    NodeProgress,
    NodeState,
    ObjectProgress,
    ProgressMemo,
    clusters_from_snapshot,
    fingerprint,
    fingerprint_of,
)
from fleet.rollout.state import RolloutState
from fleet.world.delta import Delta, DeltaList, generation, moved_since
from fleet.world.model import ObjectRef
from tests.helpers.gate import CANARY, OLD, PROD, T0, TARGET
from tests.helpers.gate_reference import ReferenceGate

_LETTER = {"w": NodeState.WAITING, "g": NodeState.UPGRADING, "u": NodeState.UP_TO_DATE,
           "f": NodeState.FAILED, "c": NodeState.CLUSTER_API, "n": NodeState.NOT_READY,
           "m": NodeState.MISSING}
_RINGS = {"canary": CANARY, "prod": PROD, "none": {}}


@dataclass
class _Cluster:
    name: str
    ring: str
    nodes: list[str]
    started: bool = False
    target: str = TARGET
    paused: str | None = None  # the Cluster's pause annotation
    object_paused: str | None = None
    spec_paused: bool = False
    observed: bool = True
    foreign: bool = False
    halted: bool = False

    def progress(self) -> ClusterProgress:
        obj = ObjectProgress(
            ref=ObjectRef("MachineDeployment", "fleet", f"{self.name}-md"),
            target=self.target, replicas=len(self.nodes), started=self.started,
            halted=self.halted, paused=self.object_paused,
            nodes=tuple(NodeProgress(f"{self.name}-{i}", f"{self.name}-{i}", _LETTER[s],
                                     self.target if s == "u" else OLD)
                        for i, s in enumerate(self.nodes)))
        return ClusterProgress(
            "fleet", self.name, labels=dict(_RINGS[self.ring]),
            annotations={} if self.paused is None else {ANN_PAUSED: self.paused},
            objects=(obj,), observed=self.observed, spec_paused=self.spec_paused,
            foreign=self.foreign)


def _config(draw: Any) -> FleetConfig:
    soak = st.sampled_from(["0s", "5m", "30m"])
    windows: list[dict[str, str]] = draw(st.sampled_from([
        [], [{"schedule": "0 22 * * *", "duration": "2h", "timeZone": "UTC"}],
        [{"schedule": "0 * * * *", "duration": "30m", "timeZone": "UTC"}]]))
    rollout: dict[str, Any] = {
        "maxConcurrentClusters": draw(st.integers(1, 3)),
        "paused": draw(st.booleans()) and draw(st.booleans()),
        "waves": [
            {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
             "maxConcurrentClusters": draw(st.integers(1, 2)), "soakSeconds": draw(soak)},
            {"name": "prod", "clusterSelector": {"matchLabels": PROD},
             "maxConcurrentClusters": draw(st.integers(1, 3)), "soakSeconds": draw(soak),
             "failureBudget": draw(st.sampled_from([0, 1, "50%"]))},
        ]}
    if windows:
        rollout["maintenanceWindows"] = windows
    entries = [{"name": "c1", "namespace": "fleet", "paused": True}] \
        if draw(st.booleans()) else []
    return FleetConfig.model_validate({"rollout": rollout, "clusters": {"entries": entries}},
                                      by_alias=True, by_name=False)


def _mutate(c: _Cluster, rnd: random.Random) -> None:
    """One random change of a cluster's progress, as the world would make it."""
    what = rnd.randrange(12)
    if what <= 4:  # nodes move on
        for i, s in enumerate(c.nodes):
            if s == "w" and rnd.random() < 0.4:
                c.nodes[i] = "g"
                c.started = True
            elif s == "g" and rnd.random() < 0.6:
                c.nodes[i] = rnd.choice("uuuuf")
            elif s == "f" and rnd.random() < 0.3:
                c.nodes[i] = rnd.choice("gw")
            elif rnd.random() < 0.05:
                c.nodes[i] = rnd.choice("cnm")
    elif what == 5:
        c.ring = rnd.choice(list(_RINGS))
    elif what == 6:
        c.paused = rnd.choice([None, None, "", "freeze"])
    elif what == 7:
        c.object_paused = rnd.choice([None, None, "", "hold it"])
    elif what == 8:
        c.observed = not c.observed
    elif what == 9:
        c.foreign = not c.foreign
    elif what == 10:  # a new target: every node waits again
        c.target = rnd.choice([TARGET, "v1.31.4+k0s.0", "v1.32.0+k0s.0"])
        c.nodes = [rnd.choice("wwwc") for _ in c.nodes]
        c.started = False
    else:
        c.spec_paused, c.halted = rnd.random() < 0.2, rnd.random() < 0.1


class _Producer:
    """Hands out the progress lists as ProgressMemo does: each a DeltaList saying which
    clusters' progress moved since the list before it, its lookup valid until the next."""

    def __init__(self) -> None:
        self.before: dict[Any, ClusterProgress] = {}
        self.delta: Delta | None = None

    def list_of(self, view: list[ClusterProgress]) -> DeltaList[ClusterProgress]:
        now = {c.key: c for c in view}
        moved = [k for k, c in now.items() if self.before.get(k) is not c]
        moved += [k for k in self.before if k not in now]
        delta = self.delta = Delta.after(self.delta, moved)
        self.before = now

        def lookup(key: Any) -> list[ClusterProgress] | None:
            if self.delta is not delta:
                return None
            c = now.get(key)
            return [] if c is None else [c]

        return DeltaList(view, delta, lookup)


def _record(d: GateDecision, previous: RolloutState, rnd: random.Random) -> RolloutState:
    """The record the next evaluation reads: written, lost, or edited by someone else."""
    roll = rnd.random()
    if roll < 0.65:
        return d.state
    if roll < 0.8:
        return previous  # the write failed
    admitted = dict(d.state.admitted)
    if admitted and rnd.random() < 0.5:
        admitted.pop(rnd.choice(sorted(admitted)))
    else:
        admitted[rnd.choice(["fleet/c0", "fleet/c3", "fleet/gone"])] = "stale-fingerprint"
    return replace(d.state, admitted=admitted)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_incremental_gate_decides_as_the_walk_over_the_whole_fleet(
        data: st.DataObject) -> None:
    cfg = _config(data.draw)
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    n = data.draw(st.integers(1, 10))
    clusters = {f"c{i}": _Cluster(f"c{i}", rnd.choice(list(_RINGS)),
                                  [rnd.choice("wwwuc") for _ in range(rnd.randint(1, 3))])
                for i in range(n)}
    gate = RolloutGate(cfg)
    kept: dict[str, ClusterProgress] = {}
    state, controls, now, writer = RolloutState(), FleetControls(), T0, True
    previous: DecisionHold | None = None
    # as the controller hands it over: lists that say what moved since the one before
    # (now and then one the gate never saw, or a plain list: it then looks at all)
    producer = _Producer() if data.draw(st.booleans(), label="by delta") else None
    for _ in range(data.draw(st.integers(1, 40))):
        for name in [k for k in kept if k not in clusters]:
            del kept[name]
        for name, c in clusters.items():
            if name not in kept:
                kept[name] = c.progress()
        view = [kept[k] for k in sorted(kept, key=lambda _: rnd.random())]  # any order
        if producer is not None and rnd.random() < 0.9:
            if rnd.random() < 0.1:
                producer.list_of(view)  # a generation the gate is not given
            view = producer.list_of(view)
        d = gate.evaluate(FleetView(view, controls, state, fleet_writer=writer), now)
        assert d == ReferenceGate(cfg).evaluate(
            FleetView(view, controls, state, fleet_writer=writer), now)
        # As the planner's hold: what it names as moved covers every verdict that did.
        hold = DecisionHold(d)
        if previous is not None:
            moved = hold.moved_since(previous)
            keys = {c.key for c in view} | set(previous.decision.clusters)
            changed = {k for k in keys if hold.verdict(k) != previous.verdict(k)}
            assert moved is None or changed <= moved
        previous = hold
        # What moves before the next evaluation.
        state = _record(d, state, rnd)
        for name in rnd.sample(sorted(clusters), rnd.randint(0, len(clusters))):
            _mutate(clusters[name], rnd)
            kept.pop(name, None)
        if rnd.random() < 0.2:
            kept.pop(rnd.choice(sorted(clusters)), None)  # the same content, a new object
        if rnd.random() < 0.1 and len(clusters) > 1:
            del clusters[rnd.choice(sorted(clusters))]
        if rnd.random() < 0.1:
            name = f"c{rnd.randrange(20)}"
            clusters.setdefault(name, _Cluster(name, rnd.choice(list(_RINGS)), ["w", "w"]))
        if rnd.random() < 0.1:
            controls = FleetControls(paused=rnd.choice([None, None, "", "freeze"]),
                                     emergency_stop=rnd.choice([None, None, None, "stop"]))
        if rnd.random() < 0.1:
            writer = not writer
        now += timedelta(seconds=rnd.choice([0, 1, 60, 299, 600, 1799, 3600, 7200]))


def test_an_evaluation_judges_again_only_the_clusters_that_moved() -> None:
    cfg = FleetConfig.model_validate({"rollout": {"maxConcurrentClusters": 2}},
                                     by_alias=True, by_name=False)
    clusters = [_Cluster(f"c{i:03d}", "none", ["u"] * 3) for i in range(300)]
    clusters[7].nodes = ["w", "w", "w"]
    gate = RolloutGate(cfg)
    view = [c.progress() for c in clusters]
    d = gate.evaluate(FleetView(view), T0)
    assert gate.judged == 300
    assert d.allowed_clusters == {("fleet", "c007")}
    # The same progress objects, the record with c007's admission: only c007 is judged
    # again (its admission changed), its verdict stays.
    d = gate.evaluate(FleetView(view, state=d.state), T0)
    assert gate.judged == 301
    assert d.allowed_clusters == {("fleet", "c007")}
    # One node of c007 done: one cluster judged again.
    clusters[7].nodes, clusters[7].started = ["u", "w", "w"], True
    view[7] = clusters[7].progress()
    d = gate.evaluate(FleetView(view, state=d.state), T0)
    assert gate.judged == 302
    assert d == ReferenceGate(cfg).evaluate(FleetView(view, state=d.previous), T0)
    # A settled cluster's verdict is the very same object from one decision to the next.
    again = gate.evaluate(FleetView(view, state=d.state), T0)
    assert again.clusters[("fleet", "c001")] is d.clusters[("fleet", "c001")]
    assert gate.judged == 302


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_progress_memo_lists_what_the_whole_snapshot_gives(data: st.DataObject) -> None:
    """Parts rebuilt for the clusters that moved (a new object), clusters joining and
    leaving: the memo's list equals the progress computed from the merged snapshot."""
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    sim = SimFleet(now=T0)
    for i in range(data.draw(st.integers(1, 6))):
        add_cluster(sim, f"c{i}", control_planes=rnd.randint(0, 3), workers=rnd.randint(0, 3),
                    max_unavailable=1)
    memo = ProgressMemo()
    merger = Merger()  # the controller's: parts that say what moved since the last merge
    parts = split(sim.snapshot())
    settings_ = PlannerSettings(default_deadline=timedelta(hours=1))
    listed: list[ClusterProgress] = []
    for step in range(data.draw(st.integers(1, 25))):
        snap = merger.merge(parts, sim.now) if rnd.random() < 0.8 else merge(parts, sim.now)
        got = memo.clusters(snap)
        assert got == clusters_from_snapshot(snap)
        # and the list says which clusters' progress moved since the one before
        said = moved_since(got, generation(listed))
        if said is not None:
            was = {c.key: c for c in listed}
            now = {c.key: c for c in got}
            assert {k for k in was.keys() | now.keys() if was.get(k) is not now.get(k)} <= said
        listed = got
        roll = rnd.random()
        if roll < 0.15:
            bump(sim, rnd.choice(sorted(sim.clusters)), f"v1.31.{3 + step}+k0s.0")
        elif roll < 0.25:
            add_cluster(sim, f"n{step}", control_planes=1, workers=rnd.randint(0, 2))
        else:
            for ckey, node in sim.active_requests():
                if rnd.random() < 0.7:
                    sim.step_node(ckey, node)
            sim.apply_all(plan(sim.snapshot(), settings_).actions)
        sim.advance(1)
        fresh = split(sim.snapshot())
        moved = rnd.sample(sorted(fresh), rnd.randint(0, len(fresh)))
        parts = {k: fresh[k] if k in moved or k not in parts else parts[k] for k in fresh}
        if rnd.random() < 0.15 and len(parts) > 1:
            del parts[rnd.choice(sorted(parts))]  # left the fleet (for this pass)


def test_a_wave_s_fingerprint_is_the_one_recorded_before() -> None:
    """Wave fingerprints are kept in the rollout record (a ConfigMap that outlives any
    controller version): the same clusters and targets give the value they gave when
    it was computed from each cluster's targets (5d4440b), the gate's way (from the
    targets it keeps per cluster) included, whatever the order."""
    def cluster(name: str, target: str) -> ClusterProgress:
        objects = tuple(ObjectProgress(ref=ObjectRef(kind, "fleet", f"{name}-{suffix}"),
                                       target=target, replicas=1, started=False,
                                       halted=False, paused=None, nodes=())
                        for kind, suffix in (("MachineDeployment", "md"),
                                             ("K0sControlPlane", "cp")))
        return ClusterProgress(namespace="fleet", name=name, labels={}, annotations={},
                               objects=objects, observed=True, foreign=False)

    pair = [cluster("b", "v1.31.3+k0s.0"), cluster("a", "v1.31.2+k0s.0")]
    assert fingerprint(pair) == fingerprint(pair[::-1]) == "789c65af0fef439a"
    assert fingerprint_of((c.namespace, c.name, tuple(c.targets())) for c in pair) \
        == "789c65af0fef439a"
