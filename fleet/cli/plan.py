"""``k0s-fleet plan``: a dry run of the rollout from the fleet's current state.

Reads the management cluster (and each workload cluster's Nodes) and prints waves ->
clusters -> objects -> node order, what is upgraded in place and what is left to Cluster
API (and why), the unavailability each step causes and an estimated duration. Writes
nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from fleet.cli import common
from fleet.config import ExtensionMode, FleetConfig
from fleet.extension.activation import extension_active, own_endpoint
from fleet.kube import KubeClient, KubeError
from fleet.kube.resources import EXTENSION_CONFIGS
from fleet.model import ClusterKey
from fleet.rollout.observe import observe
from fleet.rollout.plan import dry_run, plan_document, render_plan
from fleet.schedule import DurationError, parse_duration


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    common.add_output_argument(p)
    p.add_argument("--node-duration", default="3m",
                   help="assumed time for one node upgrade (estimate), e.g. 3m")
    p.add_argument("--now", help="plan as of this time (RFC 3339), e.g. to see windows")


async def extension_clusters(mgmt: KubeClient, config: FleetConfig,
                             keys: Iterable[ClusterKey]) -> frozenset[ClusterKey]:
    """Which clusters Cluster API drives through k0s-fleet's extension, as the controller's
    exclusion decides it (an unreadable ExtensionConfig list counts as none)."""
    if not config.extension.enabled or config.extension.mode is ExtensionMode.NEVER:
        return frozenset()
    try:
        configs = (await mgmt.list(EXTENSION_CONFIGS)).items \
            if config.extension.mode is ExtensionMode.AUTO else []
    except KubeError as e:
        print(f"k0s-fleet plan: cannot read ExtensionConfigs: {e}", file=sys.stderr)
        return frozenset()
    return frozenset(k for k in keys if extension_active(
        {"metadata": {"namespace": k[0], "name": k[1]}}, configs, config.extension.mode,
        endpoint=own_endpoint(config.extension)))


async def fleet_plan(config: FleetConfig, *, now: datetime,
                     node_duration: str = "3m") -> dict[str, Any]:
    async with await common.management_client(config) as mgmt:
        obs = await observe(mgmt, config, now=now)
        obs.extension_clusters = await extension_clusters(mgmt, config,
                                                          obs.snapshot.clusters)
    return plan_document(dry_run(obs, config, now=now,
                                 node_duration=parse_duration(node_duration)))


async def _run(args: argparse.Namespace) -> int:
    config = common.fleet_config(args)
    now = datetime.now(UTC)
    if args.now:
        try:
            now = datetime.fromisoformat(args.now.replace("Z", "+00:00"))
        except ValueError as e:
            raise common.BadInputError(f"--now: {e}") from None
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
    try:
        parse_duration(args.node_duration)
    except DurationError as e:
        raise common.BadInputError(f"--node-duration: {e}") from None
    doc = await fleet_plan(config, now=now, node_duration=args.node_duration)
    if args.output != "text":
        sys.stdout.write(common.dump(doc, args.output))
    else:
        sys.stdout.write(render_plan(doc) + "\n")
    return common.Exit.OK


def run(args: argparse.Namespace) -> int:
    return common.run_command("plan", _run, args)
