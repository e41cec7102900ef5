"""The work behind ``k0s-fleet plan`` (see fleet.rollout.cli): a dry run of the rollout.

Reads the management cluster (and each workload cluster's Nodes) and prints waves ->
clusters -> objects -> node order, what is upgraded in place and what is left to Cluster
API (and why), the unavailability each step causes and an estimated duration. Writes
nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.config import FleetConfig
from fleet.config_errors import ConfigError
from fleet.kube import KubeError
from fleet.rollout.observe import management_client, observe
from fleet.rollout.plan import dry_run, plan_document, render_plan
from fleet.schedule import parse_duration
from fleet.status.live import load


async def fleet_plan(config: FleetConfig, *, now: datetime,
                     node_duration: str = "3m") -> dict[str, Any]:
    async with await management_client(config) as mgmt:
        obs = await observe(mgmt, config, now=now)
    return plan_document(dry_run(obs, config, now=now,
                                 node_duration=parse_duration(node_duration)))


async def _run(args: argparse.Namespace) -> int:
    config = load(args)
    now = datetime.now(UTC)
    if args.now:
        now = datetime.fromisoformat(args.now.replace("Z", "+00:00"))
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
    doc = await fleet_plan(config, now=now, node_duration=args.node_duration)
    if args.output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_plan(doc) + "\n")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    try:
        return anyio.run(_run, args)
    except ConfigError as e:
        print(f"k0s-fleet plan: bad fleet config:\n{e}", file=sys.stderr)
        return 2
    except (KubeError, OSError, ValueError) as e:
        print(f"k0s-fleet plan: {e}", file=sys.stderr)
        return 1
