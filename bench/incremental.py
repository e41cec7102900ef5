"""One node event in one cluster of a large fleet: what a planning pass costs, the whole
fleet planned (before) against the cluster that moved (now). No servers.

    .venv/bin/python bench/incremental.py --sizes 10,100,1000 --events 200

``fleet.planner.simulate`` builds N clusters of 3 control planes + 7 workers, one bumped
to a new version by a FleetUpgrade selecting it (a rollout under way there, every other
cluster settled). Each event completes the running node's next step in that cluster (the
agent's answer), then one pass runs:

* **full**: the whole fleet walked: rollout progress of every cluster
  (``clusters_from_snapshot``), a fresh wave gate, the FleetUpgrade's status from every
  cluster's standing, and ``plan`` over the whole snapshot;
* **incremental**: what the controller does: the moved cluster's snapshot part rebuilt
  (the controller builds it from its per-cluster index; here it is cut from the
  simulated world, which is not timed), the snapshot merged from its parts (``Merger``),
  the rollout policy's pure work (``ProgressMemo``, the incremental ``RolloutGate``, the
  ``UpgradeStatusWriter``'s standings and status; ``policy_ms``), and the incremental
  planner given the decision as its hold (``DecisionHold``).

Both decide the same (asserted on every event: the plan, the gate's decision, the
FleetUpgrade status). ``calls_per_pass``: Python function calls of an incremental pass
(cProfile; what the machine's load does not change).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import statistics
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from fleet.config.models import FleetConfig
from fleet.controllers.dispatcher import action_target
from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import Action
from fleet.planner.incremental import IncrementalPlanner, Merger, split
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import DecisionHold, FleetView, GateDecision, RolloutGate
from fleet.rollout.intents import UpgradeStatusWriter, fleet_hold, standing
from fleet.rollout.progress import ProgressMemo, clusters_from_snapshot
from fleet.world.intent import WaveStanding, upgrade_status
from fleet.world.model import ClusterKey, FleetUpgradeInfo, IntentTarget, ObjectRef, Snapshot

V2 = "v1.31.3+k0s.0"


def _by_object(actions: list[Action]) -> dict[tuple[str, ...], list[Action]]:
    out: dict[tuple[str, ...], list[Action]] = defaultdict(list)
    for a in actions:
        out[action_target(a)].append(a)
    return dict(out)


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def _waves(d: GateDecision) -> list[WaveStanding]:
    return [WaveStanding(w.name, w.phase.value, w.message) for w in d.waves]


def one_size(n: int, events: int) -> dict[str, Any]:
    sim = SimFleet(now=datetime(2026, 1, 1, tzinfo=UTC))
    keys = [add_cluster(sim, f"c{i:04d}", control_planes=3, workers=7, max_unavailable=1)
            for i in range(n)]
    moving = keys[n // 2]
    bump(sim, moving, V2, control_plane=False, workers=True)
    upgrade = FleetUpgradeInfo(ref=ObjectRef("FleetUpgrade", "default", "to-moving", uid="u"),
                               version=V2, raw_version=V2, selector=None, created=sim.now)
    intents = {moving: IntentTarget(upgrade.ref, V2)}
    cfg = PlannerSettings(default_deadline=timedelta(hours=1))
    fleet = FleetConfig()
    gate = RolloutGate(fleet)
    planner = IncrementalPlanner(cfg)
    memo = ProgressMemo()
    merger = Merger()
    # Only its pure work is used (standings, status): no client is needed.
    writer = UpgradeStatusWriter(None, clock=lambda: sim.now)  # type: ignore[arg-type]
    parts: dict[ClusterKey, Snapshot] = split(sim.snapshot())

    def full_pass(snap: Snapshot) -> tuple[float, list[Action], GateDecision, dict[str, Any]]:
        t0 = time.perf_counter()
        clusters = clusters_from_snapshot(snap)
        decision = RolloutGate(fleet).evaluate(FleetView(clusters), snap.now)
        stand = [standing(c, decision.clusters[c.key]) for c in clusters]
        status = upgrade_status(upgrade, intents, stand, _waves(decision),
                                fleet_hold=fleet_hold(decision))
        result = plan(snap, cfg, hold=decision.hold)
        return time.perf_counter() - t0, result.actions, decision, status

    def incremental_pass(part: Snapshot | None) -> tuple[
            float, float, list[Action], list[Action], GateDecision, dict[str, Any]]:
        t0 = time.perf_counter()
        if part is not None:
            parts[moving] = part
        snap = merger.merge(parts, sim.now)
        t1 = time.perf_counter()
        clusters = memo.clusters(snap)
        decision = gate.evaluate(FleetView(clusters), sim.now)
        stand = writer.standings(decision, clusters, intents)
        status = writer.status(upgrade, intents, stand, _waves(decision), fleet_hold(decision))
        t2 = time.perf_counter()
        inc = planner.plan(parts, sim.now, hold=DecisionHold(decision))
        t3 = time.perf_counter()
        # The fleet's whole plan (put together when asked for; a pass does not): checked
        # against the full pass, not timed.
        return t3 - t0, t2 - t1, inc.fresh.actions, inc.result.actions, decision, status

    # Warm up: the first passes write every object's status; act on them until quiet.
    incremental_pass(None)
    for _ in range(20):
        snap = sim.snapshot()
        actions = plan(snap, cfg).actions
        if not actions:
            break
        sim.apply_all(actions)
    parts = split(sim.snapshot())
    planner.forget()
    incremental_pass(None)

    full_s: list[float] = []
    inc_s: list[float] = []
    policy_s: list[float] = []
    replanned = 0
    profile = cProfile.Profile()
    for _ in range(events):
        active = [a for a in sim.active_requests() if a[0] == moving]
        if active:
            sim.step_node(*active[0])
        sim.advance(1)
        part = split(sim.snapshot())[moving]  # not timed: the controller's index builds it
        full_t, full_actions, full_decision, full_status = full_pass(sim.snapshot())
        before = planner.replanned_total
        profile.enable()
        inc_t, policy_t, fresh, whole, decision, status = incremental_pass(part)
        profile.disable()
        replanned += planner.replanned_total - before
        assert _by_object(whole) == _by_object(full_actions), "incremental != full"
        assert decision == full_decision, "incremental gate != full gate"
        assert status == full_status, "FleetUpgrade status differs"
        full_s.append(full_t)
        inc_s.append(inc_t)
        policy_s.append(policy_t)
        sim.apply_all(fresh)
        if not sim.active_requests() and not fresh:
            version = f"v1.31.{4 + len(full_s)}+k0s.0"
            bump(sim, moving, version, control_plane=True, workers=True)
            upgrade = dataclasses.replace(upgrade, version=version, raw_version=version)
            intents = {moving: IntentTarget(upgrade.ref, version)}
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return {
        "clusters": n, "nodes": n * 10, "events": events,
        "full_ms_median": round(statistics.median(full_s) * 1000, 2),
        "full_ms_p99": round(percentile(full_s, 99) * 1000, 2),
        "incremental_ms_median": round(statistics.median(inc_s) * 1000, 2),
        "incremental_ms_p99": round(percentile(inc_s, 99) * 1000, 2),
        "policy_ms_median": round(statistics.median(policy_s) * 1000, 2),
        "policy_ms_p99": round(percentile(policy_s, 99) * 1000, 2),
        "calls_per_pass": round(calls / events),
        "clusters_planned_per_event": round(replanned / events, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    results = [one_size(int(n), args.events) for n in args.sizes.split(",")]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

