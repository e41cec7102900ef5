"""Node churn at scale (issue 33): N clusters whose workload clusters share 9 Nodes.

    flock /tmp/k0s-fleet-bench.lock .venv/bin/python bench/churn.py --clusters 1000 \\
        --json /tmp/churn.json [--fleet-root /tmp/churn-base]
    make bench-churn CLUSTERS=1000

The world: real etcd + three kube-apiservers from the test world. ``mgmt`` holds N CAPI
clusters (``fleet.testing.capi.create_cluster``: Cluster, kubeconfig Secret, K0sControlPlane
stand-in with 3 control-plane Machines, MachineDeployment of 6 workers) whose kubeconfig
Secrets all point at ``wl1``, where the 9 Machines of every cluster have their nodeRef on
the same 9 realistic ~14 KB Nodes (``fleet.testing.kubesim.nodes.realistic_node``): the
controller keeps one Node watch per cluster on ``wl1``, so one patch of a Node is N watch
events. One more cluster, ``roll`` (6 workers, maxUnavailable 1), lives on ``wl2`` with
the scripted node side (``fleet.testing.responder``, ``--node-seconds`` per node).

The controller is ``FleetController`` in a child process set up as ``k0s-fleet
controller`` sets it up (glibc's fixed mmap threshold; ``gc.freeze()`` after its first
pass and again once that pass's work is done), instrumented: event-loop lag (a 20 ms
sleep's overshoot, sampled continuously), every garbage collection (``gc.callbacks``:
generation, duration), and every 200 ms the oldest resourceVersion any of the N Node
watches has reached (so when each patch reached every cluster). The parent samples its
CPU and RSS from /proc every 0.5 s. ``--fleet-root`` runs the child on another checkout's
``fleet`` (a "before" measurement).

Windows, after the controller's first pass settled (and ``--settle-seconds``):

* ``idle`` (``--idle-seconds``): nothing changes;
* ``churn1`` (``--churn1-seconds`` at ``--churn1-rate`` patches/s, one annotation of one
  of the 9 Nodes in turn: rate x N Node events/s), with back-to-back one-cluster rollouts
  of ``roll`` (a FleetUpgrade to the next patch version each time): their hand-offs, a
  node's Completed written -> the next node's request seen by the node side;
* ``gap`` (``--gap-seconds``), ``churn2`` (``--churn2-rate``, ``--churn2-seconds``);
* ``after`` (``--after-seconds``): caught up (the last patch reached every watch: seconds
  after the end of churn2), RSS peak and when it came back within 10 % of ``idle``'s.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SHARED_NODES = [*(f"shared-cp-{i}" for i in range(3)), *(f"shared-md-{i}" for i in range(6))]
NAMESPACE = "churn"
CHURN_KEY = "bench.k0s-fleet.io/churn"
V1 = "v1.31.2+k0s.0"


# -- the controller child (imports the fleet of --fleet-root) -----------------------------

def child_main(fleet_root: str, kubeconfig: str, config_path: str, out: str) -> None:
    sys.path.insert(0, str(REPO))
    from bench.stats import record_gc_pauses  # noqa: PLC0415  (this checkout's bench)

    sys.path.insert(0, fleet_root)  # (and --fleet-root's fleet)
    import anyio  # noqa: PLC0415

    from fleet.controllers.heap import fixed_mmap_threshold  # noqa: PLC0415

    fixed_mmap_threshold()  # as k0s-fleet controller does
    gcs = record_gc_pauses()
    if os.environ.get("CHURN_TRACEMALLOC"):
        import tracemalloc  # noqa: PLC0415

        tracemalloc.start(int(os.environ["CHURN_TRACEMALLOC"]))
    try:  # the event loop k0s-fleet controller runs on (a checkout that has one)
        from fleet.controllers.eventloop import new_event_loop  # noqa: PLC0415
        options: dict[str, Any] = {"loop_factory": new_event_loop}
    except ImportError:
        options = {}
    anyio.run(_child, kubeconfig, config_path, out, gcs, backend_options=options)


def _heap_report(base: Any, out: str) -> None:
    """--tracemalloc: what is allocated now and was not at ``base`` (the end of the idle
    window), by the allocating tracebacks, and the Python objects by type."""
    import tracemalloc  # noqa: PLC0415
    from collections import Counter  # noqa: PLC0415

    now = tracemalloc.take_snapshot().filter_traces([
        tracemalloc.Filter(False, tracemalloc.__file__)])
    lines = [f"traced now {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MiB"]
    for stat in now.compare_to(base, "traceback")[:25]:
        lines.append(f"{stat.size_diff / 2**20:+.2f} MiB {stat.count_diff:+d} blocks")
        lines += [f"    {frame}" for frame in stat.traceback.format()[-8:]]
    types = Counter(type(o).__name__ for o in gc.get_objects())
    lines.append("gc-tracked objects by type: " + ", ".join(
        f"{name} {n}" for name, n in types.most_common(20)))
    Path(out + ".heap.txt").write_text("\n".join(lines) + "\n")


async def _child(kubeconfig: str, config_path: str, out: str,
                 gcs: list[tuple[float, int, float]]) -> None:
    import anyio  # noqa: PLC0415
    import yaml  # noqa: PLC0415

    from fleet.config.models import FleetConfig  # noqa: PLC0415
    from fleet.controllers.runner import FleetController  # noqa: PLC0415
    from fleet.controllers.trigger import Trigger  # noqa: PLC0415
    from fleet.events import EventRecorder  # noqa: PLC0415
    from fleet.extension.exclusion import ExtensionExclusion  # noqa: PLC0415
    from fleet.kube import KubeClient  # noqa: PLC0415
    from fleet.rollout.policy import RolloutPolicy  # noqa: PLC0415

    config = FleetConfig.model_validate(yaml.safe_load(
        await anyio.Path(config_path).read_text()))
    mgmt = await KubeClient.from_kubeconfig_file(kubeconfig, name="management")
    quiet = anyio.Event()
    stages: list[tuple[str, float]] = []

    def after_start_up(stage: str) -> None:
        gc.freeze()  # fleet.cli.controller's _freeze_startup
        stages.append((stage, time.time()))
        if stage == "first quiet":
            quiet.set()

    # As `k0s-fleet controller --no-leader-elect` builds it: the rollout policy (waves,
    # windows, pauses) inside the runtime extension's exclusion, one trigger, an Event
    # recorder (the write limiter is left out: the bench's writes are few)
    trigger = Trigger()
    # who pokes the controller (the poke's caller, two frames up), counted per window
    pokers: dict[str, int] = {}
    poke = trigger.poke

    def counted_poke() -> None:
        f = sys._getframe(1)
        up = f.f_back
        where = f"{f.f_code.co_qualname}<{up.f_code.co_qualname if up else ''}"
        pokers[where] = pokers.get(where, 0) + 1
        poke()

    trigger.poke = counted_poke  # type: ignore[method-assign]
    recorder = EventRecorder(mgmt, instance="bench",
                             default_namespace=config.management.namespace)
    rollout = RolloutPolicy(mgmt, config, recorder=recorder)
    exclusion = ExtensionExclusion(mgmt, config, rollout, on_change=trigger.poke)
    controller = FleetController(mgmt, config, identity="bench", recorder=recorder,
                                 trigger=trigger, policy=exclusion,
                                 after_start_up=after_start_up)
    lags: list[tuple[float, float]] = []
    rvs: list[tuple[float, int]] = []
    # (time, planning passes, trigger pokes, pokes by caller)
    counts: list[tuple[float, int, int, dict[str, int]]] = []

    async def loop_lag() -> None:
        while True:
            t = time.perf_counter()
            await anyio.sleep(0.02)
            lags.append((time.time(), time.perf_counter() - t - 0.02))

    watched: list[Any] = []  # the N Node reflectors (looked up again every 5 s)

    def oldest_rv() -> int:
        # (resourceVersions are digits: the shortest, then the least, is the oldest; no
        # int() of each: this sampler's CPU is counted in the controller's)
        versions = [v for r in watched if (v := r.resource_version).isdigit()]
        return int(min(versions, key=lambda v: (len(v), v))) if versions else 0

    async def find_watched() -> None:
        while True:
            watched[:] = [wc.node_reflector
                          for key, wc in list(controller.registry.clusters.items())
                          if key[-1] != "roll" and wc.node_reflector is not None]
            await anyio.sleep(5)

    async def watch_rvs() -> None:  # ~0.3 ms a look at 1000 clusters: 5 looks a second
        while True:
            rvs.append((time.time(), oldest_rv()))
            counts.append((time.time(), controller.stats.passes, trigger.pokes,
                           dict(pokers)))
            await anyio.sleep(0.2)

    base: list[Any] = []
    profiler = None
    if os.environ.get("CHURN_PROFILE"):
        import cProfile  # noqa: PLC0415

        profiler = cProfile.Profile()
    async with anyio.create_task_group() as tg:
        async def stop_on_term() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGUSR1) as rx:
                async for sig in rx:
                    if sig == signal.SIGUSR1:  # the idle window's end: --tracemalloc's base
                        if os.environ.get("CHURN_TRACEMALLOC"):
                            import tracemalloc  # noqa: PLC0415

                            base[:] = [tracemalloc.take_snapshot()]
                        if profiler is not None:
                            profiler.enable()
                        continue
                    if base:
                        _heap_report(base[0], out)
                    if profiler is not None:
                        import pstats  # noqa: PLC0415

                        profiler.disable()
                        with open(out + ".prof.txt", "w") as f:  # noqa: ASYNC230
                            pstats.Stats(profiler, stream=f).sort_stats(
                                "tottime").print_stats(45)
                    await anyio.Path(out).write_text(json.dumps({
                        "lags": lags, "gcs": gcs, "rvs": rvs, "counts": counts,
                        "stages": stages,
                        "heap_trims": controller.heap.trims,
                        "passes": controller.stats.passes,
                        "frozen": gc.get_freeze_count(),
                        "fleet": str(Path(sys.modules["fleet"].__file__ or "").parent)}))
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_on_term)
        tg.start_soon(rollout.run, trigger.poke, controller.clock)
        tg.start_soon(exclusion.run)
        await tg.start(controller.run)

        async def mark_quiet() -> None:
            await quiet.wait()
            await anyio.Path(out + ".quiet").write_text("1")

        tg.start_soon(mark_quiet)
        tg.start_soon(loop_lag)
        tg.start_soon(find_watched)
        tg.start_soon(watch_rvs)
    await mgmt.close()


# -- the parent ---------------------------------------------------------------------------

def _stats_ms(values: list[float]) -> dict[str, float]:
    from bench.stats import percentile  # noqa: PLC0415

    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(percentile(values, 0.5) * 1000, 1),
            "p99": round(percentile(values, 0.99) * 1000, 1),
            "max": round(max(values) * 1000, 1)}


async def _create_fleet(mgmt: Any, wl1: Any, wl1_kubeconfig: dict[str, Any], n: int,
                        concurrency: int) -> None:
    import anyio  # noqa: PLC0415

    from fleet.kube.resources import MACHINES  # noqa: PLC0415
    from fleet.testing.capi import create_cluster  # noqa: PLC0415

    limiter = anyio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            fc = await create_cluster(mgmt, wl1, wl1_kubeconfig, namespace=NAMESPACE,
                                      name=f"c{i:04d}", control_planes=3, workers=6,
                                      max_unavailable=1, create_nodes=False)
            for machine, node in zip(fc.machines, SHARED_NODES, strict=True):
                await mgmt.patch(MACHINES, machine, {"status": {"nodeRef": {
                    "apiVersion": "v1", "kind": "Node", "name": node}}}, NAMESPACE,
                    subresource="status")

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)


def _window(samples: list[Any], start: float, end: float) -> list[Any]:
    return [s for s in samples if start <= s[0] < end]


def summarise(marks: dict[str, tuple[float, float]], usage: list[tuple[float, float, float]], *,
              child: dict[str, Any], patches: list[tuple[float, int]],
              handoffs: list[tuple[float, float]], clusters: int) -> dict[str, Any]:
    rvs: list[tuple[float, int]] = child["rvs"]

    def reached(rv: int, since: float) -> float | None:
        for t, low in rvs:
            if t >= since and low >= rv:
                return t
        return None

    idle_rss = [u[2] for u in _window(usage, *marks["idle"])]
    steady = statistics.median(idle_rss) if idle_rss else math.nan
    out: dict[str, Any] = {"steady_rss_mib": round(steady, 1)}
    for name, (start, end) in marks.items():
        us = _window(usage, start, end)
        w: dict[str, Any] = {"seconds": round(end - start, 1)}
        if len(us) >= 2:
            w["cpu_percent"] = round(100 * (us[-1][1] - us[0][1]) / (us[-1][0] - us[0][0]), 1)
            w["rss_mib"] = {"mean": round(statistics.mean(u[2] for u in us), 1),
                            "max": round(max(u[2] for u in us), 1)}
        w["loop_lag_ms"] = _stats_ms([lag for _, lag in _window(child["lags"], start, end)])
        gcs = _window(child["gcs"], start, end)
        w["gc"] = {"seconds": round(sum(g[2] for g in gcs), 3),
                   "collections": [sum(1 for g in gcs if g[1] == k) for k in range(3)],
                   "longest_ms": round(max((g[2] for g in gcs), default=0.0) * 1000, 1)}
        ps = _window(patches, start, end)
        if ps:
            delays = []
            for t, rv in ps:
                at = reached(rv, t)
                delays.append(math.inf if at is None else at - t)
            w["patches"] = len(ps)
            w["node_events_per_s"] = round(len(ps) * clusters / (end - start))
            w["delivery_to_every_cluster_ms"] = _stats_ms(delays)
            last_t, last_rv = ps[-1]
            at = reached(last_rv, last_t)
            w["caught_up_after_end_s"] = None if at is None else round(max(0.0, at - end), 2)
        cs = _window(child.get("counts", []), start, end)
        if len(cs) >= 2:  # planning passes and trigger pokes per second
            span = cs[-1][0] - cs[0][0]
            w["passes_per_s"] = round((cs[-1][1] - cs[0][1]) / span, 1)
            w["pokes_per_s"] = round((cs[-1][2] - cs[0][2]) / span, 1)
            first, last = cs[0][3], cs[-1][3]
            w["pokes_by_caller"] = dict(sorted(
                ((k, n - first.get(k, 0)) for k, n in last.items() if n > first.get(k, 0)),
                key=lambda kv: -kv[1]))
        hs = [g for t, g in handoffs if start <= t < end]
        if hs:
            w["handoff_ms"] = _stats_ms(hs)
        out[name] = w
    if "after" in marks and idle_rss:
        start, end = marks["after"]
        back = next((t for t, _, rss in _window(usage, start, end)
                     if rss <= steady * 1.1), None)
        out["after"]["back_within_10pct_of_steady_s"] = None if back is None else \
            round(back - start, 1)
        out["after"]["rss_at_end_mib"] = round(_window(usage, start, end)[-1][2], 1)
    out["peak_rss_mib"] = round(max(u[2] for u in usage), 1)
    out["heap_trims"] = child.get("heap_trims")
    out["frozen_objects"] = child.get("frozen")
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import anyio  # noqa: PLC0415
    import yaml  # noqa: PLC0415

    from bench.rollout import bench_config  # noqa: PLC0415
    from bench.scale import proc_usage  # noqa: PLC0415
    from fleet.kube.resources import NAMESPACES, NODES  # noqa: PLC0415
    from fleet.testing.capi import bump, create_cluster, ensure_infra_crd  # noqa: PLC0415
    from fleet.testing.kubesim.nodes import realistic_node  # noqa: PLC0415
    from fleet.testing.responder import NodeResponder  # noqa: PLC0415
    from fleet.testing.world import World  # noqa: PLC0415

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="k0s-fleet-churn-"))
    await anyio.Path(workdir).mkdir(parents=True, exist_ok=True)
    world = World(["mgmt", "wl1", "wl2"], workdir=workdir / "world")
    await anyio.to_thread.run_sync(world.start)
    result: dict[str, Any] = {"clusters": args.clusters, "fleet_root": args.fleet_root}
    try:
        await world.install_crds()
        mgmt = await world["mgmt"].client()
        wl1 = await world["wl1"].client()
        wl2 = await world["wl2"].client()
        await ensure_infra_crd(mgmt)
        await mgmt.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        for i, name in enumerate(SHARED_NODES):
            node = realistic_node(name, V1, control_plane=name.startswith("shared-cp"),
                                  index=i)
            status = node.pop("status")
            await wl1.create(NODES, node)
            await wl1.patch(NODES, name, {"status": status}, subresource="status")
        t0 = time.monotonic()
        await _create_fleet(mgmt, wl1, world["wl1"].kubeconfig(), args.clusters,
                            args.create_concurrency)
        roll = await create_cluster(mgmt, wl2, world["wl2"].kubeconfig(),
                                    namespace=NAMESPACE, name="roll", control_planes=0,
                                    workers=6, max_unavailable=1)
        result["setup_s"] = round(time.monotonic() - t0, 1)
        print(f"fleet of {args.clusters} written in {result['setup_s']} s", flush=True)
        cfg = workdir / "fleet.yaml"
        cfg.write_text(yaml.safe_dump(bench_config(NAMESPACE)))
        kubeconfig = world["mgmt"].write_kubeconfig(workdir / "mgmt.yaml")
        out = workdir / "controller.json"
        responder = NodeResponder(wl2, step_seconds=args.node_seconds / 7,
                                  only=lambda n: n in roll.machines)
        usage: list[tuple[float, float, float]] = []
        patches: list[tuple[float, int]] = []
        marks: dict[str, tuple[float, float]] = {}
        handoffs: list[tuple[float, float]] = []  # (wall time of the completion, gap)
        with (workdir / "controller.log").open("wb") as log:
            env = {**os.environ, "PYTHONPATH": args.fleet_root}
            if args.tracemalloc:
                env["CHURN_TRACEMALLOC"] = str(args.tracemalloc)
            if args.profile:
                env["CHURN_PROFILE"] = "1"
            child = await anyio.open_process(
                [sys.executable, __file__, "--controller-child", args.fleet_root,
                 str(kubeconfig), str(cfg), str(out)], stdout=log, stderr=log,
                cwd=args.fleet_root, env=env)
        t_start = time.time()
        try:
            async with anyio.create_task_group() as tg:
                async def sample() -> None:
                    while True:
                        u = proc_usage(child.pid)
                        if u is not None:
                            usage.append((time.time(), u["cpu_s"], u["rss_mib"]))
                        await anyio.sleep(0.5)

                tg.start_soon(sample)
                await tg.start(responder.run)
                with anyio.fail_after(args.timeout):
                    while not await anyio.Path(str(out) + ".quiet").exists():
                        if child.returncode is not None:
                            raise RuntimeError("the controller exited; see controller.log")
                        await anyio.sleep(0.2)
                result["start_to_first_quiet_s"] = round(time.time() - t_start, 1)
                print(f"controller settled after {result['start_to_first_quiet_s']} s",
                      flush=True)
                await anyio.sleep(args.settle_seconds)

                async def window(name: str, seconds: float) -> None:
                    start = time.time()
                    await anyio.sleep(seconds)
                    marks[name] = (start, time.time())
                    print(f"window {name} done", flush=True)

                async def churn(rate: float, seconds: float) -> None:
                    start = time.monotonic()
                    k = 0
                    while (due := start + k / rate) < start + seconds:
                        await anyio.sleep(max(0.0, due - time.monotonic()))
                        name = SHARED_NODES[k % len(SHARED_NODES)]
                        t = time.time()
                        got = await wl1.patch(NODES, name, {"metadata": {"annotations": {
                            CHURN_KEY: f"{k}-{t:.3f}"}}})
                        patches.append((t, int(got["metadata"]["resourceVersion"])))
                        k += 1

                async def rollouts(seconds: float) -> None:
                    end = time.monotonic() + seconds
                    minor = 3
                    while time.monotonic() < end:
                        done_before = sum(1 for s in responder.steps
                                          if s.state == "Completed")
                        seen_before = len(responder.seen_at)
                        await bump(mgmt, roll, f"v1.31.{minor}+k0s.0")
                        minor += 1
                        with anyio.fail_after(120):
                            while sum(1 for s in responder.steps
                                      if s.state == "Completed") < done_before + 6:
                                await anyio.sleep(0.05)
                        starts = sorted(list(responder.seen_at.values())[seen_before:])
                        done = sorted(s.at for s in responder.steps
                                      if s.state == "Completed")[done_before:]
                        offset = time.time() - time.monotonic()
                        handoffs.extend((done[i] + offset, starts[i + 1] - done[i])
                                        for i in range(len(starts) - 1))

                await window("idle", args.idle_seconds)
                child.send_signal(signal.SIGUSR1)
                async with anyio.create_task_group() as w:
                    w.start_soon(churn, args.churn1_rate, args.churn1_seconds)
                    w.start_soon(rollouts, args.churn1_seconds)
                    await window("churn1", args.churn1_seconds)
                await window("gap", args.gap_seconds)
                async with anyio.create_task_group() as w:
                    w.start_soon(churn, args.churn2_rate, args.churn2_seconds)
                    await window("churn2", args.churn2_seconds)
                await window("after", args.after_seconds)
                tg.cancel_scope.cancel()
        finally:
            child.send_signal(signal.SIGTERM)
            with anyio.move_on_after(60):
                await child.wait()
            if child.returncode is None:
                child.kill()
            await mgmt.close()
            await wl1.close()
            await wl2.close()
        child_data = json.loads(out.read_text())
        (workdir / "usage.json").write_text(json.dumps({"usage": usage, "patches": patches,
                                                        "marks": marks,
                                                        "handoffs": handoffs}))
        result.update(summarise(marks, usage, child=child_data, patches=patches,
                                handoffs=handoffs, clusters=args.clusters))
        result["stages"] = child_data.get("stages")
        result["controller_fleet"] = child_data.get("fleet")
    finally:
        await anyio.to_thread.run_sync(world.close)
    result["host"] = {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}
    result["workdir"] = str(workdir)
    return result


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--controller-child":
        child_main(*sys.argv[2:6])
        return 0
    sys.path.insert(0, str(REPO))
    import anyio  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--fleet-root", default=str(REPO),
                   help="the checkout whose fleet the controller runs (default: this one)")
    p.add_argument("--create-concurrency", type=int, default=16)
    p.add_argument("--node-seconds", type=float, default=0.7,
                   help="the node side's time per node upgrade of the rollouts")
    p.add_argument("--settle-seconds", type=float, default=10.0)
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--churn1-rate", type=float, default=1.0, help="Node patches per second")
    p.add_argument("--churn1-seconds", type=float, default=60.0)
    p.add_argument("--gap-seconds", type=float, default=20.0)
    p.add_argument("--churn2-rate", type=float, default=10.0)
    p.add_argument("--churn2-seconds", type=float, default=30.0)
    p.add_argument("--after-seconds", type=float, default=90.0)
    p.add_argument("--timeout", type=float, default=1200.0,
                   help="deadline for the controller's start-up")
    p.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                   help="trace allocations (FRAMES deep) in the controller and write what "
                   "it holds at the end that it did not after the idle window to "
                   "<workdir>/controller.json.heap.txt (slow: for finding, not measuring)")
    p.add_argument("--profile", action="store_true",
                   help="cProfile the controller's event loop from the end of the idle "
                   "window on: <workdir>/controller.json.prof.txt (for finding, not "
                   "measuring)")
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    args.fleet_root = str(Path(args.fleet_root).resolve())
    result = anyio.run(run, args)
    from bench.stats import report  # noqa: PLC0415
    return report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
