"""``k0s-fleet demo``: watch a simulated fleet upgrade itself, live in the terminal.

Starts a management API server and one API server per workload cluster (real
kube-apiserver + etcd from the test world), creates the Cluster API objects of each
cluster (a K0sControlPlane with 3 control planes, a MachineDeployment of 6 workers with
maxUnavailable 2), one simulated node per Machine (a fake k0s under a supervisor, and a
real ``k0s-fleet agent`` process), and a local release server with pinned digests; runs
the controller with the fleet rollout policy (cluster-1 is a canary wave with a short
soak, the others follow two at a time); asks for the new version through one
``FleetUpgrade`` (the controller writes every K0sControlPlane and MachineDeployment version
itself); and shows the rollout until it is done. With
``--fast`` the node side is a scripted stand-in for the agents (no agent processes).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
)
from rich.table import Table
from rich.text import Text

from fleet.cli.upgrade import apply_upgrade
from fleet.config.models import FleetConfig, TelemetrySettings
from fleet.contract.nodeplan import NodePlanPhase, nodeplan_name
from fleet.contract.versions import same_version
from fleet.controllers.runner import FleetController
from fleet.events import EventRecorder
from fleet.kube.resources import CLUSTERS, NAMESPACES, NODE_PLANS
from fleet.planner import PlanResult
from fleet.rollout.policy import RolloutPolicy
from fleet.telemetry import get_tracer, setup_tracing
from fleet.testing.binaries import MissingBinaryError, binary
from fleet.testing.capi import create_cluster, ensure_infra_crd
from fleet.testing.jaeger import Jaeger
from fleet.testing.releases import ReleaseServer
from fleet.testing.responder import NodeResponder
from fleet.testing.simnode import SimNode
from fleet.testing.world import World
from fleet.world.model import ROLE_CONTROLLER, Snapshot

FROM, TO = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
NAMESPACE = "fleet-demo"
RING = "k0s-fleet.io/ring"

log = logging.getLogger(__name__)

STATE_STYLE = {
    "UpToDate": "bold green", "Waiting": "dim", "Pending": "yellow", "Completed": "green",
    "Failed": "bold red", "NotReady": "red", "Downloading": "cyan", "Cordoning": "cyan",
    "ApplyingUpdate": "magenta", "Restarting": "magenta", "Verifying": "blue",
    "UnCordoning": "cyan",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clusters", type=int, default=3, help="workload clusters (default 3)")
    p.add_argument("--control-planes", type=int, default=3, help="per cluster (default 3)")
    p.add_argument("--workers", type=int, default=6, help="per cluster (default 6)")
    p.add_argument("--max-unavailable", default="2", help="of each MachineDeployment")
    p.add_argument("--fast", action="store_true",
                   help="scripted nodes instead of agent processes: quicker, lighter")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="give up (exit 1) after this many seconds in total")
    p.add_argument("--workdir", type=Path, help="where logs and traces go (default: a temp dir)")
    p.add_argument("--no-jaeger", dest="jaeger", action="store_false",
                   help="do not export traces to a local Jaeger even where it is built")


@dataclass
class ClusterView:
    name: str
    task: Any  # rich TaskID
    total: int
    done: int = 0
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    waiting: str = ""
    failed: int = 0


class Board:
    """What the terminal shows, rebuilt after every controller pass."""

    def __init__(self, clusters: list[str], per_cluster: int) -> None:

        self.progress = Progress(TextColumn("{task.description:<10}"), BarColumn(bar_width=40),
                                 MofNCompleteColumn(), TextColumn("{task.fields[note]}"))
        self.clusters = {c: ClusterView(c, self.progress.add_task(c, total=per_cluster, note=""),
                                        per_cluster) for c in clusters}
        self.phase = "starting"
        self.started = time.monotonic()
        self.rollout_started: float | None = None
        self.finished: float | None = None
        self.passes = 0

    def update(self, snapshot: Snapshot, result: PlanResult) -> None:

        self.passes += 1
        waiting = {(d.owner.namespace, d.owner.name): d.waiting for d in result.decisions}
        if not result.decisions:
            waiting = {}
        targets = {kcp.ref: kcp.version for kcp in snapshot.control_planes.values()}
        targets |= {md.ref: md.version for md in snapshot.deployments.values()}
        for view in self.clusters.values():
            rows = []
            done = failed = 0
            ms = sorted((m for m in snapshot.machines.values() if m.cluster == view.name),
                        key=lambda m: (m.role != ROLE_CONTROLLER, m.ref.name))
            nodes = snapshot.nodes.get((NAMESPACE, view.name)) or {}
            for m in ms:
                target = targets.get(m.owner) if m.owner else None
                node = nodes.get(m.node_name)
                # Done only on the demo's target: right after the bump, the snapshot may
                # still hold the old target, which every node already runs.
                plan = snapshot.nodeplans.get((m.ref.namespace, nodeplan_name(
                    m.ref.name, target))) if target else None
                # ... and its NodePlan (if any) recorded Completed: the node-upgrade span is
                # written with that status, and the demo prints those traces when done.
                # (A worker's Completed NodePlan is its record until the paused sequence
                # ends: fleet.world.eligibility.as_recorded.)
                completed = plan is not None and plan.phase == NodePlanPhase.COMPLETED
                up = same_version(target, TO) and (same_version(m.version, target) or same_version(
                    m.running_version_annotation, target) or completed) and (
                    plan is None or completed)
                if plan is not None and plan.phase == NodePlanPhase.FAILED:
                    state = "Failed"
                    failed += 1
                elif up:
                    state = "UpToDate"
                    done += 1
                elif plan is not None and plan.started:
                    state = (node.signal.status.status.value if node and node.signal
                             and node.signal.planId == plan.plan_id and node.signal.status
                             else plan.node_state or "Pending")
                elif node is not None and not node.ready:
                    state = "NotReady"
                else:
                    state = "Waiting"
                running = (node.running_version if node else None) or "?"
                role = "control plane" if m.role == ROLE_CONTROLLER else "worker"
                rows.append((m.ref.name, role, state, running))
            view.rows, view.done, view.failed = rows, done, failed
            notes = [w for (ns, name), w in waiting.items() if w and name.startswith(view.name)]
            view.waiting = notes[0] if notes else ""
            self.progress.update(view.task, completed=done,
                                 note=("[red]" + f"{failed} failed " if failed else "")
                                 + (view.waiting[:60] if done < view.total else "[green]done"))

    def render(self) -> Group:

        elapsed = time.monotonic() - (self.rollout_started or self.started)
        head = Text.assemble(("k0s-fleet demo", "bold"), f"  {FROM} -> {TO}  ",
                             (self.phase, "yellow" if self.finished is None else "green"),
                             f"  {elapsed:5.1f}s  ({self.passes} planning passes)")
        table = Table(expand=False, box=None, pad_edge=False)
        for col in ("cluster", "node", "role", "state", "k0s"):
            table.add_column(col)
        for view in self.clusters.values():
            for name, role, state, running in view.rows:
                table.add_row(view.name, name, role,
                              Text(state, style=STATE_STYLE.get(state, "")), running)
        return Group(head, self.progress, table)

    @property
    def complete(self) -> bool:
        return all(v.done == v.total for v in self.clusters.values())


def summary_table(board: Board, snapshot: Snapshot | None) -> Table:

    t = Table(title="rollout summary")
    for col in ("cluster", "control planes", "workers", "node upgrades", "failed",
                "slowest node", "cluster done after"):
        t.add_column(col, justify="right" if col not in ("cluster",) else "left")
    for view in board.clusters.values():
        cps = [r for r in view.rows if r[1] == "control plane"]
        ws = [r for r in view.rows if r[1] == "worker"]
        plans = [p for p in (snapshot.nodeplans.values() if snapshot else [])
                 if p.cluster == view.name]
        durations = [(p.completed_at - p.started_at).total_seconds() for p in plans
                     if p.completed_at and p.started_at]
        first = min((p.started_at for p in plans if p.started_at), default=None)
        last = max((p.completed_at for p in plans if p.completed_at), default=None)
        t.add_row(view.name,
                  f"{sum(r[2] == 'UpToDate' for r in cps)}/{len(cps)}",
                  f"{sum(r[2] == 'UpToDate' for r in ws)}/{len(ws)}",
                  str(len(plans)), str(view.failed),
                  f"{max(durations):.1f}s" if durations else "-",
                  f"{(last - first).total_seconds():.1f}s" if first and last else "-")
    return t


@contextlib.asynccontextmanager
async def _world(names: list[str], workdir: Path) -> AsyncIterator[Any]:


    world = World(names, workdir=workdir / "world")
    await anyio.to_thread.run_sync(world.start)
    try:
        await world.install_crds()
        yield world
    finally:
        await anyio.to_thread.run_sync(world.close)


def _workdir(args: argparse.Namespace) -> Path:
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="k0s-fleet-demo-"))
    (workdir / "traces").mkdir(parents=True, exist_ok=True)
    return workdir


async def _main(args: argparse.Namespace) -> int:
    """The demo, with a local Jaeger receiving its traces where Jaeger is built."""
    workdir = _workdir(args)
    jaeger: Jaeger | None = None
    if args.jaeger:
        try:
            binary("jaeger")
            jaeger = Jaeger(workdir / "jaeger")
        except MissingBinaryError:
            jaeger = None
    with contextlib.ExitStack() as stack:
        if jaeger is not None:
            stack.enter_context(jaeger)
        code, shown = await _demo(args, workdir, jaeger)
        if jaeger is not None and shown and sys.stdin.isatty():
            await anyio.to_thread.run_sync(
                input, "Jaeger keeps the traces until you press Enter ... ")
    return code


async def _demo(args: argparse.Namespace, workdir: Path,
                jaeger: Jaeger | None) -> tuple[int, int]:
    console = Console()
    traces = workdir / "traces"
    logging.basicConfig(filename=workdir / "demo.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = [f"wl{i + 1}" for i in range(args.clusters)]
    clusters = [f"cluster-{i + 1}" for i in range(args.clusters)]
    per_cluster = args.control_planes + args.workers
    board = Board(clusters, per_cluster)
    max_unavailable: int | str = int(args.max_unavailable) if str(
        args.max_unavailable).isdigit() else str(args.max_unavailable)
    last: dict[str, Snapshot] = {}
    deadline = time.monotonic() + args.timeout
    console.print(f"[bold]k0s-fleet demo[/]: {args.clusters} clusters x ({args.control_planes} "
                  f"control planes + {args.workers} workers), "
                  f"{'scripted nodes' if args.fast else 'real agents'}; logs in {workdir}")
    otlp = jaeger.otlp_endpoint if jaeger is not None else None
    if jaeger is not None:
        console.print(f"traces also go to Jaeger: {jaeger.query_url}")
    trace_ids: list[tuple[str, str]] = []
    ok = False
    with anyio.move_on_after(args.timeout) as scope:
        async with _world(["mgmt", *names], workdir) as w, \
                ReleaseServer() as releases, contextlib.AsyncExitStack() as stack:
            assert isinstance(w, World)
            old, new = releases.add(FROM), releases.add(TO)
            mgmt = await w["mgmt"].client()
            stack.push_async_callback(mgmt.close)
            await ensure_infra_crd(mgmt)
            await mgmt.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
            provider = setup_tracing(TelemetrySettings(
                service_name="k0s-fleet-controller", trace_file=str(traces / "controller.jsonl"),
                otlp_endpoint=otlp))
            stack.callback(provider.shutdown)
            config = FleetConfig.model_validate({
                "management": {"namespace": NAMESPACE},
                "clusters": {"namespaces": [NAMESPACE]},
                "download": {"urlTemplate": releases.base_url + "/k0s/{version}?arch={arch}",
                             "digests": {TO: {"amd64": new.sha256}}},
                "agent": {"drainTimeout": "30s", "verifyTimeout": "30s"},
                # Waves: the first cluster is the canary (no failure tolerated, a short
                # soak), then the rest at most two clusters at a time.
                "rollout": {"waves": [
                    {"name": "canary", "canary": True, "soakSeconds": 2,
                     "clusterSelector": {"matchLabels": {RING: "canary"}}},
                    {"name": "fleet", "maxConcurrentClusters": 2, "soakSeconds": 0,
                     "clusterSelector": {"matchLabels": {RING: "fleet"}}}],
                    "progressDeadlines": {
                    "pending": "60s", "downloading": "60s", "cordoning": "60s",
                    "applyingUpdate": "60s", "restarting": "60s", "verifying": "60s",
                    "unCordoning": "60s"}},
            })
            fcs = []
            responders = []
            for server, cluster in zip(names, clusters, strict=True):
                wl = await w[server].client()
                stack.push_async_callback(wl.close)
                fc = await create_cluster(
                    mgmt, wl, w[server].kubeconfig(), namespace=NAMESPACE, name=cluster,
                    version=FROM, control_planes=args.control_planes,
                    workers=args.workers, max_unavailable=max_unavailable,
                    create_nodes=args.fast)
                fcs.append(fc)
                ring = "canary" if not fcs[:-1] else "fleet"
                await mgmt.patch(CLUSTERS, cluster, {"metadata": {"labels": {RING: ring}}},
                                 NAMESPACE)
                if args.fast:
                    responders.append(NodeResponder(wl, step_seconds=0.1))
                    continue
                console.print(f"starting {len(fc.machines)} simulated nodes of {cluster} ...")
                for machine in fc.machines:
                    await stack.enter_async_context(SimNode.running(
                        wl, w[server].kubeconfig(), workdir / "nodes" / machine, old,
                        name=machine, agent_args=[
                            "--trace-file", str(traces / f"agent-{machine}.jsonl"),
                            *(["--otlp-endpoint", otlp] if otlp else [])]))
            async with anyio.create_task_group() as tg:
                for responder in responders:
                    await tg.start(responder.run)

                def on_pass(snapshot: Snapshot, result: PlanResult) -> None:
                    last["snapshot"] = snapshot
                    board.update(snapshot, result)

                # The fleet rollout policy (waves, soak, windows, pauses) gates each pass.
                recorder = EventRecorder(mgmt, instance="demo",
                                         default_namespace=config.management.namespace)
                rollout = RolloutPolicy(mgmt, config, recorder=recorder)
                controller = FleetController(
                    mgmt, config, identity="demo", on_pass=on_pass, policy=rollout,
                    recorder=recorder,
                    tracer=get_tracer("fleet.controller", provider))
                tg.start_soon(rollout.run, controller.trigger.poke, controller.clock)
                await tg.start(controller.run)
                with Live(board.render(), console=console, refresh_per_second=8,
                          transient=False) as live:
                    board.phase = f"FleetUpgrade to {TO}"
                    await apply_upgrade(mgmt, namespace=NAMESPACE, name="demo", version=TO,
                                        selector=None)
                    board.rollout_started = time.monotonic()
                    board.phase = "rolling out"
                    while time.monotonic() < deadline:
                        live.update(board.render())
                        if board.complete and board.rollout_started and board.passes:
                            break
                        await anyio.sleep(0.125)
                    board.finished = time.monotonic()
                    board.phase = "done" if board.complete else "incomplete"
                    live.update(board.render())
                ok = board.complete
                tg.cancel_scope.cancel()
            for plan in (await mgmt.list(NODE_PLANS, NAMESPACE)).items:
                tp = str((plan.get("status") or {}).get("traceparent") or "")
                if tp.count("-") == 3:
                    trace_ids.append((plan["metadata"]["name"], tp.split("-")[1]))
            provider.force_flush()
    if scope.cancelled_caught:
        console.print(f"[red]gave up after {args.timeout:.0f}s[/]")
    console.print(summary_table(board, last.get("snapshot")))
    took = (board.finished or time.monotonic()) - (board.rollout_started or board.started)
    spans = sum(sum(1 for _ in f.open()) for f in traces.glob("*.jsonl"))
    console.print(Panel.fit(
        f"{'[green]all nodes upgraded' if ok else '[red]not all nodes upgraded'}[/] "
        f"in {took:.1f}s\ntraces: {spans} spans as JSON lines in {traces}/ "
        f"(controller.jsonl{'' if args.fast else ' and one agent-<node>.jsonl per node'})\n"
        f"logs: {workdir}", title="k0s-fleet demo"))
    # one trace per node upgrade: show a few
    for plan_name, trace_id in sorted(trace_ids)[:3]:
        link = f"  {jaeger.query_url}/api/traces/{trace_id}" if jaeger is not None else ""
        console.print(f"trace of {plan_name}: {trace_id}{link}", soft_wrap=True)
    if len(trace_ids) > 3:
        console.print(f"... and {len(trace_ids) - 3} more (NodePlan status.traceparent)")
    return (0 if ok else 1), len(trace_ids)


def run(args: argparse.Namespace) -> int:

    try:
        return anyio.run(_main, args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one clear line, the details in the log
        print(f"k0s-fleet demo: {type(e).__name__}: {e}", file=sys.stderr)
        log.exception("demo failed")
        return 1
