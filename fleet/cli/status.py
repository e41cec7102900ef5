"""``k0s-fleet status``: the fleet rollout at a glance (live, or ``--once``, or JSON).

By default it observes the fleet itself (read-only: the management cluster from the
kubeconfig, each workload cluster through its kubeconfig Secret) and evaluates the rollout
gate exactly as the controller does, with the fleet YAML the controller runs with (the
chart's ConfigMap in the controller's namespace; ``--config`` for a local one), and says
which it used; ``--url`` reads the controller's own ``/status`` instead. ``-o wide`` adds
each cluster's executors, current step, node and time in that step.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

import aiohttp
import anyio
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from fleet.cli import common
from fleet.cli.plan import extension_clusters
from fleet.cli.progress import current_steps, wide_columns
from fleet.config import FleetConfig
from fleet.kube import KubeClient
from fleet.model import ControlPlaneInfo, MachineDeploymentInfo
from fleet.planner.writer import executor_of
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.observe import Observation, observe
from fleet.rollout.progress import clusters_from_snapshot
from fleet.schedule import DurationError, parse_duration
from fleet.status.model import build_status
from fleet.status.view import render


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    common.add_output_argument(p, wide=True)
    p.add_argument("--once", action="store_true", help="print once and exit (no live view)")
    p.add_argument("--interval", default="5s", help="refresh interval of the live view")
    p.add_argument("--url", help="read the controller's /status (e.g. http://localhost:8080)")


async def status_with(mgmt: KubeClient, config: FleetConfig, *, now: datetime | None = None
                      ) -> tuple[dict[str, Any], Observation]:
    """Observe the fleet once: its status document and the observation (writes nothing)."""
    obs = await observe(mgmt, config, now=now)
    clusters = clusters_from_snapshot(obs.snapshot)
    decision = RolloutGate(config).evaluate(FleetView(clusters, obs.controls, obs.state),
                                            obs.snapshot.now)
    return build_status(decision, clusters, problems=obs.problems), obs


async def fleet_status(config: FleetConfig, *, now: datetime | None = None) -> dict[str, Any]:
    """Observe the fleet once and compute its status document (writes nothing)."""
    async with await common.management_client(config) as mgmt:
        doc, _ = await status_with(mgmt, config, now=now)
    return doc


async def wide_columns_of(mgmt: KubeClient, config: FleetConfig, obs: Observation
                          ) -> dict[str, dict[str, str]]:
    """``-o wide``: per cluster (``namespace/name``) its objects' executors, its current
    step, the node and the time in it."""
    snap = obs.snapshot
    extension = await extension_clusters(mgmt, config, snap.clusters)
    executors: dict[tuple[str, str], list[str]] = {}
    owners: list[MachineDeploymentInfo | ControlPlaneInfo] = [
        *snap.deployments.values(), *snap.control_planes.values()]
    for o in owners:
        key = (o.ref.namespace, o.cluster)
        executors.setdefault(key, []).append(executor_of(o, capi_drives=key in extension)[0])
    steps = current_steps(snap.nodeplans.values())
    return {f"{k[0]}/{k[1]}": wide_columns(steps.get(k, []), executors.get(k, []), snap.now)
            for k in snap.clusters}


async def _from_url(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url.rstrip("/") + "/status") as r:
        r.raise_for_status()
        doc: dict[str, Any] = await r.json()
        return doc


async def _run_url(args: argparse.Namespace, interval: float) -> int:
    console = Console()
    if args.output in ("json", "yaml"):
        sys.stdout.write(common.dump(await _from_url(args.url), args.output))
        return common.Exit.OK
    banner = Text(f"config: the controller's own (/status of {args.url})"
                  + ("; -o wide's columns need the cluster itself (without --url)"
                     if args.output == "wide" else ""), style="dim")
    if args.once:
        console.print(Group(banner, render(await _from_url(args.url))))
        return common.Exit.OK
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while True:
            live.update(Group(banner, render(await _from_url(args.url))), refresh=True)
            await anyio.sleep(interval)


async def _run(args: argparse.Namespace) -> int:
    try:
        interval = parse_duration(args.interval).total_seconds()
    except DurationError as e:
        raise common.BadInputError(f"--interval: {e}") from None
    if args.url:
        return await _run_url(args, interval)
    console = Console()
    async with common.fleet_session(args) as (mgmt, resolved):
        config = resolved.config
        if args.output in ("json", "yaml"):
            print(f"k0s-fleet status: {resolved.banner()}", file=sys.stderr)
            doc, _ = await status_with(mgmt, config, now=datetime.now(UTC))
            sys.stdout.write(common.dump(doc, args.output))
            return common.Exit.OK

        async def view() -> Group:
            doc, obs = await status_with(mgmt, config, now=datetime.now(UTC))
            wide = await wide_columns_of(mgmt, config, obs) if args.output == "wide" else None
            return Group(Text(resolved.banner(), style="dim"), render(doc, wide=wide))

        if args.once:
            console.print(await view())
            return common.Exit.OK
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                live.update(await view(), refresh=True)
                await anyio.sleep(interval)


def run(args: argparse.Namespace) -> int:
    return common.run_command("status", _run, args, failures=(aiohttp.ClientError,))
