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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module for every subcommand: keep it light
    from rich.console import Group
    from rich.table import Table

    from fleet.model import Snapshot
    from fleet.planner import PlanResult

HELP = "watch a simulated fleet (real API servers, real agents) upgrade k0s in place"
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
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
        )

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
        from fleet.model import ROLE_CONTROLLER  # noqa: PLC0415
        from fleet.nodeplan import NodePlanPhase, nodeplan_name  # noqa: PLC0415
        from fleet.versions import same_version  # noqa: PLC0415

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
                up = same_version(target, TO) and (same_version(m.version, target) or same_version(
                    m.running_version_annotation, target))
                plan = snapshot.nodeplans.get((m.ref.namespace, nodeplan_name(
                    m.ref.name, target))) if target else None
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
        from rich.console import Group  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415
        from rich.text import Text  # noqa: PLC0415

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
    from rich.table import Table  # noqa: PLC0415

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
    import anyio  # noqa: PLC0415

    from fleet.testing.world import World  # noqa: PLC0415

    world = World(names, workdir=workdir / "world")
    await anyio.to_thread.run_sync(world.start)
    try:
        await world.install_crds()
        yield world
    finally:
        await anyio.to_thread.run_sync(world.close)


async def _main(args: argparse.Namespace) -> int:
    import anyio  # noqa: PLC0415
    from rich.console import Console  # noqa: PLC0415
    from rich.live import Live  # noqa: PLC0415
    from rich.panel import Panel  # noqa: PLC0415

    from fleet.config import FleetConfig, TelemetrySettings  # noqa: PLC0415
    from fleet.controllers.runner import FleetController  # noqa: PLC0415
    from fleet.kube.resources import CLUSTERS, NAMESPACES  # noqa: PLC0415
    from fleet.rollout.policy import attach_rollout  # noqa: PLC0415
    from fleet.telemetry import get_tracer, setup_tracing  # noqa: PLC0415
    from fleet.testing.capi import create_cluster, ensure_infra_crd  # noqa: PLC0415
    from fleet.testing.releases import ReleaseServer  # noqa: PLC0415
    from fleet.testing.responder import NodeResponder  # noqa: PLC0415
    from fleet.testing.simnode import SimNode  # noqa: PLC0415
    from fleet.testing.world import World  # noqa: PLC0415
    from fleet.upgrade_cli import apply_upgrade  # noqa: PLC0415

    console = Console()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="k0s-fleet-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    traces = workdir / "traces"
    traces.mkdir(exist_ok=True)
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
                service_name="k0s-fleet-controller", trace_file=str(traces / "controller.jsonl")))
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
                            "--trace-file", str(traces / f"agent-{machine}.jsonl")]))
            async with anyio.create_task_group() as tg:
                for responder in responders:
                    await tg.start(responder.run)

                def on_pass(snapshot: Snapshot, result: PlanResult) -> None:
                    last["snapshot"] = snapshot
                    board.update(snapshot, result)

                controller = FleetController(
                    mgmt, config, identity="demo", on_pass=on_pass,
                    tracer=get_tracer("fleet.controller", provider))
                # The fleet rollout policy (waves, soak, windows, pauses) gates each pass.
                rollout = attach_rollout(controller)
                tg.start_soon(rollout.wake_on_schedule)
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
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    import anyio  # noqa: PLC0415

    try:
        return anyio.run(_main, args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one clear line, the details in the log
        print(f"k0s-fleet demo: {type(e).__name__}: {e}", file=sys.stderr)
        log.exception("demo failed")
        return 1
