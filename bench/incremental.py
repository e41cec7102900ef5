"""One node event in one cluster of a large fleet: what a planning pass costs, the whole
fleet planned (before) against the cluster that moved (now). No servers.

    .venv/bin/python bench/incremental.py --sizes 10,100,1000 --events 200

``fleet.planner.simulate`` builds N clusters of 3 control planes + 7 workers, one bumped
to a new version (a rollout under way there, every other cluster settled). Each event
completes the running node's next step in that cluster (the agent's answer), then one
pass runs:

* **full**: what the controller did per pass before: rollout progress of every cluster
  (``clusters_from_snapshot``), the wave gate, and ``plan`` over the whole snapshot;
* **incremental**: what it does now: the moved cluster's snapshot part rebuilt (the
  controller builds it from its per-cluster index; here it is cut from the simulated
  world, which is not timed), progress recomputed for that part only
  (``ProgressMemo``), the wave gate over all clusters' (memoised) progress, the whole
  snapshot merged from its parts, and the incremental planner.

Both decide the same (asserted on every event).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from fleet.config import FleetConfig
from fleet.controllers.dispatcher import action_target
from fleet.model import ClusterKey, Snapshot
from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import Action
from fleet.planner.incremental import IncrementalPlanner, merge, split
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import ProgressMemo, clusters_from_snapshot

V2 = "v1.31.3+k0s.0"


def _by_object(actions: list[Action]) -> dict[tuple[str, ...], list[Action]]:
    out: dict[tuple[str, ...], list[Action]] = defaultdict(list)
    for a in actions:
        out[action_target(a)].append(a)
    return dict(out)


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def one_size(n: int, events: int) -> dict[str, Any]:
    sim = SimFleet(now=datetime(2026, 1, 1, tzinfo=UTC))
    keys = [add_cluster(sim, f"c{i:04d}", control_planes=3, workers=7, max_unavailable=1)
            for i in range(n)]
    moving = keys[n // 2]
    bump(sim, moving, V2, control_plane=False, workers=True)
    cfg = PlannerSettings(default_deadline=timedelta(hours=1))
    gate = RolloutGate(FleetConfig())
    planner = IncrementalPlanner(cfg)
    memo = ProgressMemo()
    parts: dict[ClusterKey, Snapshot] = split(sim.snapshot())

    def full_pass(snap: Snapshot) -> tuple[float, list[Action]]:
        t0 = time.perf_counter()
        clusters = clusters_from_snapshot(snap)
        gate.evaluate(FleetView(clusters), snap.now)
        result = plan(snap, cfg)
        return time.perf_counter() - t0, result.actions

    def incremental_pass(part: Snapshot | None) -> tuple[float, list[Action], list[Action]]:
        t0 = time.perf_counter()
        if part is not None:
            parts[moving] = part
        snap = merge(parts, sim.now)
        clusters = memo.clusters(snap)
        gate.evaluate(FleetView(clusters), sim.now)
        inc = planner.plan(parts, sim.now)
        return time.perf_counter() - t0, inc.fresh.actions, inc.result.actions

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
    replanned = 0
    for _ in range(events):
        active = [a for a in sim.active_requests() if a[0] == moving]
        if active:
            sim.step_node(*active[0])
        sim.advance(1)
        part = split(sim.snapshot())[moving]  # not timed: the controller's index builds it
        full_t, full_actions = full_pass(sim.snapshot())
        before = planner.replanned_total
        inc_t, fresh, whole = incremental_pass(part)
        replanned += planner.replanned_total - before
        assert _by_object(whole) == _by_object(full_actions), "incremental != full"
        full_s.append(full_t)
        inc_s.append(inc_t)
        sim.apply_all(fresh)
        if not sim.active_requests() and not fresh:
            bump(sim, moving, f"v1.31.{4 + len(full_s)}+k0s.0", control_plane=True,
                 workers=True)
    return {
        "clusters": n, "nodes": n * 10, "events": events,
        "full_ms_median": round(statistics.median(full_s) * 1000, 2),
        "full_ms_p99": round(percentile(full_s, 99) * 1000, 2),
        "incremental_ms_median": round(statistics.median(inc_s) * 1000, 2),
        "incremental_ms_p99": round(percentile(inc_s, 99) * 1000, 2),
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

