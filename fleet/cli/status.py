"""``k0s-fleet status``: the fleet rollout at a glance (live, or ``--once``, or JSON).

By default it observes the fleet itself (read-only: the management cluster from the
kubeconfig, each workload cluster through its kubeconfig Secret) and evaluates the rollout
gate exactly as the controller does, with the fleet YAML the controller runs with (the
chart's ConfigMap in the controller's namespace; ``--config`` for a local one), and says
which it used; ``--url`` reads the controller's own ``/status`` instead. ``-o wide`` adds
each cluster's executors, current step, node and time in that step.

Without ``--once`` it follows the rollout: on a terminal the view is redrawn in place every
``--interval``; not on a terminal (a pipe, a log) it is printed as plain lines, and again
only when the rollout changed (not for the clock alone), as ``kubectl get --watch`` does,
until interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import anyio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from fleet.cli import common
from fleet.cli.exit import Exit
from fleet.cli.plan import extension_clusters
from fleet.cli.progress import current_steps, wide_columns
from fleet.config.models import FleetConfig
from fleet.config.schedule import DurationError, parse_duration
from fleet.kube import KubeClient
from fleet.planner.writer import executor_of
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.observe import Observation, observe
from fleet.rollout.progress import clusters_from_snapshot
from fleet.status.model import build_status
from fleet.status.view import render
from fleet.world.model import ControlPlaneInfo, MachineDeploymentInfo


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    common.add_output_argument(p, wide=True)
    p.add_argument("--once", action="store_true", help="print once and exit (no live view; "
                   "not on a terminal the view is printed again on each change)")
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


Frame = Callable[[], Awaitable[tuple[RenderableType, str]]]


def change_key(doc: dict[str, Any], wide: dict[str, dict[str, str]] | None = None) -> str:
    """What makes a new frame worth printing when not on a terminal: the document and the
    wide columns but for the clock (``generatedAt``, the time in a step)."""
    return json.dumps([{k: v for k, v in doc.items() if k != "generatedAt"},
                       {c: {k: v for k, v in cols.items() if k != "inStep"}
                        for c, cols in (wide or {}).items()}], sort_keys=True, default=str)


async def follow(console: Console, frame: Frame, *, once: bool, interval: float) -> int:
    """Print ``frame()`` once (``--once``); on a terminal redraw it in place every
    ``interval``; otherwise print it, then again each time its key changes (plain lines:
    a pipe or a log gets one view per change, like ``kubectl get --watch``)."""
    if once:
        console.print((await frame())[0])
        return Exit.OK
    if not console.is_terminal:
        last: str | None = None
        while True:
            view, key = await frame()
            if key != last:
                console.print(view)
                console.file.flush()
                last = key
            await anyio.sleep(interval)  # the poll period, not a synchronisation
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while True:
            live.update((await frame())[0], refresh=True)
            await anyio.sleep(interval)


async def _run_url(args: argparse.Namespace, interval: float) -> int:
    console = Console()
    if args.output in ("json", "yaml"):
        sys.stdout.write(common.dump(await _from_url(args.url), args.output))
        return Exit.OK
    banner = Text(f"config: the controller's own (/status of {args.url})"
                  + ("; -o wide's columns need the cluster itself (without --url)"
                     if args.output == "wide" else ""), style="dim")

    async def frame() -> tuple[RenderableType, str]:
        doc = await _from_url(args.url)
        return Group(banner, render(doc)), change_key(doc)

    return await follow(console, frame, once=args.once, interval=interval)


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
            return Exit.OK

        async def frame() -> tuple[RenderableType, str]:
            doc, obs = await status_with(mgmt, config, now=datetime.now(UTC))
            wide = await wide_columns_of(mgmt, config, obs) if args.output == "wide" else None
            return (Group(Text(resolved.banner(), style="dim"), render(doc, wide=wide)),
                    change_key(doc, wide))

        return await follow(console, frame, once=args.once, interval=interval)


def run(args: argparse.Namespace) -> int:
    return common.run_command("status", _run, args, failures=(aiohttp.ClientError,))
