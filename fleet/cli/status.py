"""``k0s-fleet status``: the fleet rollout at a glance (live, or ``--once``, or JSON).

By default it observes the fleet itself (read-only: the management cluster from the
fleet config's kubeconfig, each workload cluster through its kubeconfig Secret) and
evaluates the rollout gate exactly as the controller does; ``--url`` reads the
controller's own ``/status`` instead.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

import aiohttp
import anyio
from rich.console import Console
from rich.live import Live

from fleet.cli import common
from fleet.config import FleetConfig
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.observe import observe
from fleet.rollout.progress import clusters_from_snapshot
from fleet.schedule import DurationError, parse_duration
from fleet.status.model import build_status
from fleet.status.view import render


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    common.add_output_argument(p)
    p.add_argument("--once", action="store_true", help="print once and exit (no live view)")
    p.add_argument("--interval", default="5s", help="refresh interval of the live view")
    p.add_argument("--url", help="read the controller's /status (e.g. http://localhost:8080)")


async def fleet_status(config: FleetConfig, *, now: datetime | None = None) -> dict[str, Any]:
    """Observe the fleet once and compute its status document (writes nothing)."""
    async with await common.management_client(config) as mgmt:
        obs = await observe(mgmt, config, now=now)
    clusters = clusters_from_snapshot(obs.snapshot)
    decision = RolloutGate(config).evaluate(FleetView(clusters, obs.controls, obs.state),
                                            obs.snapshot.now)
    return build_status(decision, clusters, problems=obs.problems)


async def _from_url(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url.rstrip("/") + "/status") as r:
        r.raise_for_status()
        doc: dict[str, Any] = await r.json()
        return doc


async def _once(args: argparse.Namespace, config: FleetConfig | None) -> dict[str, Any]:
    if args.url:
        return await _from_url(args.url)
    assert config is not None
    return await fleet_status(config, now=datetime.now(UTC))


async def _run(args: argparse.Namespace) -> int:
    config = None if args.url else common.fleet_config(args)
    console = Console()
    try:
        interval = parse_duration(args.interval).total_seconds()
    except DurationError as e:
        raise common.BadInputError(f"--interval: {e}") from None
    if args.output != "text":
        sys.stdout.write(common.dump(await _once(args, config), args.output))
        return common.Exit.OK
    if args.once:
        console.print(render(await _once(args, config)))
        return common.Exit.OK
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while True:
            live.update(render(await _once(args, config)), refresh=True)
            await anyio.sleep(interval)


def run(args: argparse.Namespace) -> int:
    return common.run_command("status", _run, args, failures=(aiohttp.ClientError,))
