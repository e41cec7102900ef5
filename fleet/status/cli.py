"""``k0s-fleet status``: the fleet rollout at a glance (live, or ``--once``, or JSON).

By default it observes the fleet itself (read-only: the management cluster from the
fleet config's kubeconfig, each workload cluster through its kubeconfig Secret) and
evaluates the rollout gate exactly as the controller does; ``--url`` reads the
controller's own ``/status`` instead. (Imports are deferred so ``k0s-fleet --help``
stays fast.)
"""

from __future__ import annotations

import argparse

HELP = "show the fleet rollout: waves, clusters, nodes by state, halted objects"


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="fleet YAML (default: $K0S_FLEET_CONFIG, else defaults)")
    p.add_argument("--kubeconfig", help="management cluster kubeconfig (overrides the "
                   "config's management.kubeconfig)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--once", action="store_true", help="print once and exit (no live view)")
    p.add_argument("--interval", default="5s", help="refresh interval of the live view")
    p.add_argument("--url", help="read the controller's /status (e.g. http://localhost:8080)")


def run(args: argparse.Namespace) -> int:
    from fleet.status.live import run_status  # noqa: PLC0415 (keep --help fast)

    return run_status(args)
