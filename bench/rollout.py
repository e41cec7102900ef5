"""Rollout benchmark: one cluster of 12 workers, maxUnavailable 3, fixed per-node time.

    .venv/bin/python bench/rollout.py [--workers 12] [--max-unavailable 3]
                                      [--node-seconds 2.1] [--runs 3] [--json out.json]

Real kube-apiservers (management + one workload cluster) from the test world; the
controller runs in a child process (``k0s-fleet controller`` internals, no leader
election) so that its CPU time and peak RSS are its own; it counts every API request it
makes. The node side is the scripted responder (fleet.testing.responder): every node
takes the same simulated time, split evenly over its 7 protocol steps.

Measured per run:
* makespan: version bump -> MachineDeployment K0sFleetUpToDate, against the lower bound
  ceil(workers / maxUnavailable) x per-node time (nominal, and as measured on the nodes);
* completion -> next start gap: a node's Completed write landing -> the next node's
  request showing up in its watch (the k-th completion frees the slot of the
  (k+maxUnavailable)-th start);
* API requests per node upgrade, by verb, management and workload cluster together;
* controller CPU seconds and peak RSS (getrusage of the child).

A second mode measures the planner alone on simulated fleets (no servers):
    .venv/bin/python bench/rollout.py --planner-scale 10,100,1000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.stats import percentile  # noqa: E402
from fleet.config.models import FleetConfig  # noqa: E402
from fleet.controllers.runner import FleetController  # noqa: E402
from fleet.kube import KubeClient  # noqa: E402
from fleet.kube.resources import MACHINE_DEPLOYMENTS, NAMESPACES  # noqa: E402
from fleet.planner import PlannerSettings, plan  # noqa: E402
from fleet.planner.actions import CreateNodePlan  # noqa: E402
from fleet.planner.simulate import SimFleet, add_cluster  # noqa: E402
from fleet.planner.simulate import bump as sim_bump  # noqa: E402
from fleet.testing.capi import bump, create_cluster, ensure_infra_crd  # noqa: E402
from fleet.testing.responder import NodeResponder  # noqa: E402
from fleet.testing.world import World  # noqa: E402
from fleet.world.intent import apply_intents, fleet_upgrade_from  # noqa: E402

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
NAMESPACE = "bench"


# -- the controller child -------------------------------------------------------------------

class CountingClient(KubeClient):
    counts: Counter[str] = Counter()

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        CountingClient.counts[f"{self.name.split(':')[0]} {method}"] += 1
        return await super().request(method, path, **kw)

    async def open_stream(self, path: str, **kw: Any) -> Any:
        CountingClient.counts[f"{self.name.split(':')[0]} WATCH"] += 1
        return await super().open_stream(path, **kw)


async def _counting_factory(kubeconfig: Mapping[str, Any], name: str) -> KubeClient:
    plain = await KubeClient.from_kubeconfig(kubeconfig, name=name)
    return CountingClient(plain._api, name=name)


def _usage() -> tuple[float, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss


async def controller_child(kubeconfig: str, config_path: str, out: str) -> None:
    text = await anyio.Path(config_path).read_text()
    config = FleetConfig.model_validate(yaml.safe_load(text))
    plain = await KubeClient.from_kubeconfig_file(kubeconfig, name="management")
    mgmt = CountingClient(plain._api, name="management")
    controller = FleetController(mgmt, config, identity="bench",
                                 client_factory=_counting_factory)
    marks: dict[str, Any] = {}

    async with anyio.create_task_group() as tg:
        async def signals() -> None:
            with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM) as rx:
                async for sig in rx:
                    cpu, rss = _usage()
                    snap = {"counts": dict(CountingClient.counts), "cpu": cpu, "maxrss": rss,
                            "passes": controller.stats.passes,
                            "actions": controller.stats.actions,
                            "reaction": list(controller.stats.dispatch_reaction)}
                    if sig == signal.SIGUSR1:
                        marks["start"] = snap
                    else:
                        marks["end"] = snap
                        await anyio.Path(out).write_text(json.dumps(marks))
                        tg.cancel_scope.cancel()
                        return

        tg.start_soon(signals)
        await tg.start(controller.run)
        await anyio.Path(out + ".ready").write_text("1")
    await mgmt.close()


# -- one measured run -------------------------------------------------------------------------

def bench_config(namespace: str) -> dict[str, Any]:
    deadlines = dict.fromkeys(("pending", "downloading", "cordoning", "applyingUpdate",
                               "restarting", "verifying", "unCordoning"), "60s")
    return {
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                     "allowUnverified": True},
        "agent": {"drainTimeout": "30s", "verifyTimeout": "30s"},
        "rollout": {"progressDeadlines": deadlines},
    }


async def one_run(world: Any, run: int, args: argparse.Namespace, workdir: Path
                  ) -> dict[str, Any]:
    ns = f"{NAMESPACE}-{run}"
    mgmt = await world["mgmt"].client()
    wl = await world["wl1"].client()
    try:
        await ensure_infra_crd(mgmt)
        await mgmt.create(NAMESPACES, {"metadata": {"name": ns}})
        fc = await create_cluster(mgmt, wl, world["wl1"].kubeconfig(), namespace=ns,
                                  name=f"c{run}", control_planes=0, workers=args.workers,
                                  max_unavailable=args.max_unavailable)
        cfg = workdir / f"fleet-{run}.yaml"
        cfg.write_text(yaml.safe_dump(bench_config(ns)))
        kubeconfig = world["mgmt"].write_kubeconfig(workdir / "mgmt.yaml")
        out = workdir / f"controller-{run}.json"
        step = args.node_seconds / 7
        responder = NodeResponder(wl, step_seconds=step, only=lambda n: n in fc.machines)
        with (workdir / f"controller-{run}.log").open("wb") as log:
            child = await anyio.open_process(
                [sys.executable, __file__, "--controller-child", str(kubeconfig), str(cfg),
                 str(out)], stdout=log, stderr=log, cwd=str(REPO),
                env={**os.environ, "PYTHONPATH": str(REPO)})
        async with anyio.create_task_group() as tg:
            await tg.start(responder.run)
            with anyio.fail_after(60):
                while not await anyio.Path(str(out) + ".ready").exists():
                    await anyio.sleep(0.05)
            await anyio.sleep(1.0)  # settled: initial status written, idle
            child.send_signal(signal.SIGUSR1)
            await anyio.sleep(0.2)
            t0 = time.monotonic()
            await bump(mgmt, fc, V2)
            with anyio.fail_after(args.node_seconds * args.workers + 120):
                while True:
                    md = await mgmt.get(MACHINE_DEPLOYMENTS, str(fc.md), ns)
                    conds = {c["type"]: c for c in (md.get("status") or {}).get("conditions")
                             or []}
                    # Cluster API's MD CRD prunes status.k0sFleet; the condition says it.
                    up = conds.get("K0sFleetUpToDate", {})
                    if up.get("status") == "True" and (up.get("message") or "").startswith(
                            f"{args.workers}/{args.workers} machines on {V2}"):
                        break
                    await anyio.sleep(0.02)
            makespan = time.monotonic() - t0
            await anyio.sleep(0.5)
            child.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                await child.wait()
            tg.cancel_scope.cancel()
    finally:
        await mgmt.close()
        await wl.close()

    marks = json.loads(out.read_text())
    start, end = marks["start"], marks["end"]
    counts = Counter(end["counts"])
    counts.subtract(Counter(start["counts"]))
    starts = sorted(t for (node, _p), t in responder.seen_at.items())
    done = sorted(s.at for s in responder.steps if s.state == "Completed")
    completed = {(s.node, s.plan_id): s.at for s in responder.steps if s.state == "Completed"}
    per_node = [completed[key] - seen for key, seen in responder.seen_at.items()
                if key in completed]
    k = int(args.max_unavailable)
    gaps = [starts[i + k] - done[i] for i in range(len(starts) - k)]
    requests = {key: v for key, v in sorted(counts.items()) if v}
    total = sum(requests.values())
    return {
        "makespan": makespan,
        "bound_nominal": math.ceil(args.workers / k) * args.node_seconds,
        "bound_measured": math.ceil(args.workers / k) * statistics.mean(per_node),
        "node_seconds_measured": statistics.mean(per_node),
        "gaps": gaps,
        "requests": requests,
        "requests_per_node": total / args.workers,
        "cpu_seconds": end["cpu"] - start["cpu"],
        "peak_rss_mib": end["maxrss"] / 1024,
        "passes": end["passes"] - start["passes"],
        "reaction": end["reaction"][len(start["reaction"]):],
        "actions": end["actions"] - start["actions"],
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="k0s-fleet-bench-"))
    world = World(["mgmt", "wl1"], workdir=workdir / "world")
    await anyio.to_thread.run_sync(world.start)
    try:
        await world.install_crds()
        runs = [await one_run(world, i, args, workdir) for i in range(args.runs)]
    finally:
        await anyio.to_thread.run_sync(world.close)
    gaps = [g for r in runs for g in r["gaps"]]
    req: Counter[str] = Counter()
    for r in runs:
        req.update(r["requests"])
    return {
        "workers": args.workers, "max_unavailable": args.max_unavailable,
        "node_seconds_nominal": args.node_seconds, "runs": runs,
        "summary": {
            "makespan_s": [round(r["makespan"], 2) for r in runs],
            "lower_bound_nominal_s": runs[0]["bound_nominal"],
            "lower_bound_measured_s": [round(r["bound_measured"], 2) for r in runs],
            "makespan_over_measured_bound": [round(r["makespan"] / r["bound_measured"], 3)
                                             for r in runs],
            "gap_ms_median": round(statistics.median(gaps) * 1000, 1),
            "gap_ms_p99": round(percentile(gaps, 0.99) * 1000, 1),
            "gap_ms_max": round(max(gaps) * 1000, 1),
            "gap_samples": len(gaps),
            "controller_reaction_ms_median": round(statistics.median(
                x for r in runs for x in r["reaction"]) * 1000, 2),
            "controller_reaction_ms_p99": round(percentile(
                [x for r in runs for x in r["reaction"]], 0.99) * 1000, 2),
            "requests_per_node_upgrade": round(statistics.mean(
                r["requests_per_node"] for r in runs), 1),
            "requests_by_verb_per_node": {k: round(v / (args.workers * len(runs)), 2)
                                          for k, v in sorted(req.items())},
            "controller_cpu_s_per_run": [round(r["cpu_seconds"], 2) for r in runs],
            "controller_peak_rss_mib": round(max(r["peak_rss_mib"] for r in runs), 1),
        },
        "host": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
    }


# -- the planner alone at scale (simulation) ------------------------------------------------

def planner_scale(sizes: list[int], *, intent: bool = False) -> dict[str, Any]:
    """Plan passes on N simulated clusters. ``intent``: one FleetUpgrade instead of bumped
    objects; the passes that enrol the objects and write their versions run first, and the
    time to lay the intent over the snapshot (apply_intents) is measured too."""
    out = {}
    for n in sizes:
        sim = SimFleet(now=datetime(2026, 1, 1, tzinfo=UTC))
        for i in range(n):
            key = add_cluster(sim, f"c{i}", control_planes=3, workers=6)
            if not intent:
                sim_bump(sim, key, V2)
        settings = PlannerSettings()
        extra: dict[str, Any] = {}
        if intent:
            sim.upgrades[("k0s-fleet-system", "all")] = fleet_upgrade_from({
                "metadata": {"namespace": "k0s-fleet-system", "name": "all"},
                "spec": {"version": V2}})
            for _ in range(2):  # enrol, then write (paused) every control plane's version
                sim.apply_all(plan(sim.snapshot(), settings).actions)
            raw = dataclasses.replace(sim.snapshot(), deployments=dict(sim.deployments),
                                      control_planes=dict(sim.control_planes))
            t0 = time.perf_counter()
            apply_intents(raw, sim.upgrades.values())
            extra["apply_intents_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        snap = sim.snapshot()
        t0 = time.perf_counter()
        result = plan(snap, settings)
        first = time.perf_counter() - t0
        sim.apply_all(result.actions)
        snap = sim.snapshot()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            plan(snap, settings)
            times.append(time.perf_counter() - t0)
        out[str(n)] = {"clusters": n, "machines": n * 9, "first_pass_ms": round(first * 1000, 1),
                       "steady_pass_ms": round(statistics.median(times) * 1000, 1),
                       "dispatched": sum(isinstance(a, CreateNodePlan) for a in result.actions),
                       **extra}
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--controller-child":
        kubeconfig, config_path, out = sys.argv[2:5]
        anyio.run(controller_child, kubeconfig, config_path, out)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--max-unavailable", type=int, default=3)
    p.add_argument("--node-seconds", type=float, default=2.1,
                   help="simulated time per node upgrade (7 steps of node-seconds/7)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the full results here")
    p.add_argument("--planner-scale", help="comma-separated cluster counts: planner only")
    p.add_argument("--intent", action="store_true",
                   help="with --planner-scale: one FleetUpgrade instead of bumped objects")
    args = p.parse_args()
    if args.planner_scale:
        result = planner_scale([int(x) for x in args.planner_scale.split(",")],
                               intent=args.intent)
    else:
        result = anyio.run(bench, args)
    text = json.dumps(result if args.planner_scale else result["summary"] | {
        "host": result["host"]}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
