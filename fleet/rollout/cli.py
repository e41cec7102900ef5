"""``k0s-fleet plan``: a dry run of the rollout from the fleet's current state.

Reads the management cluster (and each workload cluster's Nodes) and prints waves ->
clusters -> objects -> node order, what is upgraded in place and what is left to Cluster
API (and why), the unavailability each step causes and an estimated duration. Writes
nothing. (Imports are deferred so ``k0s-fleet --help`` stays fast.)
"""

from __future__ import annotations

import argparse

from fleet.status.cli import add_common

HELP = "dry run: print what the rollout would do from here (writes nothing)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--node-duration", default="3m",
                   help="assumed time for one node upgrade (estimate), e.g. 3m")
    p.add_argument("--now", help="plan as of this time (RFC 3339), e.g. to see windows")


def run(args: argparse.Namespace) -> int:
    from fleet.rollout.dryrun_cli import run_plan  # noqa: PLC0415 (keep --help fast)

    return run_plan(args)
