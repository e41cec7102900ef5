"""``k0s-fleet controller``: run the fleet controller (with leader election)."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module for every subcommand: keep it light
    from fleet.config import FleetConfig

HELP = "run the controller: watch Cluster API objects and upgrade k0s in place"

log = logging.getLogger("fleet.controller")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="fleet YAML (default: $K0S_FLEET_CONFIG; else defaults)")
    p.add_argument("--kubeconfig", help="management cluster kubeconfig (overrides "
                   "management.kubeconfig; default: in-cluster service account)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="leader election identity (default: $POD_NAME or the host name)")
    p.add_argument("--no-leader-elect", dest="leader_elect", action="store_false",
                   help="run without a Lease (only ever one instance!)")
    p.add_argument("--lease-seconds", type=int, default=15, help="Lease duration")
    p.add_argument("--log-level", default=os.environ.get("K0S_FLEET_LOG_LEVEL", "INFO"))


async def _main(args: argparse.Namespace, config: FleetConfig) -> int:
    import anyio  # noqa: PLC0415

    # Imported here so that `k0s-fleet agent` never pays for the controller's imports.
    from fleet.controllers.leader import LeaderElector, LostLeadershipError  # noqa: PLC0415
    from fleet.controllers.runner import FleetController  # noqa: PLC0415
    from fleet.extension.exclusion import ExtensionExclusion  # noqa: PLC0415
    from fleet.extension.server import serve_configured_extension  # noqa: PLC0415
    from fleet.kube import KubeClient  # noqa: PLC0415
    from fleet.rollout.policy import attach_rollout  # noqa: PLC0415
    from fleet.telemetry import get_tracer, setup_tracing  # noqa: PLC0415

    kubeconfig = args.kubeconfig or config.management.kubeconfig
    context = args.context or config.management.context
    mgmt = (await KubeClient.from_kubeconfig_file(kubeconfig, name="management",
                                                  context=context)
            if kubeconfig else KubeClient.in_cluster(name="management"))
    provider = setup_tracing(config.telemetry, resource_attributes={
        "service.instance.id": args.identity})
    try:
        controller = FleetController(mgmt, config, identity=args.identity,
                                     tracer=get_tracer("fleet.controller", provider))
        # Fleet rollout policy (waves, windows, pauses) + /status, /metrics, health.
        rollout = attach_rollout(controller)
        # Clusters whose in-place updates CAPI drives through our runtime extension are
        # left to it by the standalone sequencer (extension.mode; docs/runtime-extension.md).
        exclusion = ExtensionExclusion(mgmt, config, controller.policy,
                                       on_change=controller.trigger.poke)
        controller.policy = exclusion

        async def lead() -> None:
            await controller.run()

        async with anyio.create_task_group() as tg:
            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        log.info("stopping")
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(on_signal)
            tg.start_soon(rollout.serve)
            tg.start_soon(exclusion.run)
            # CAPI calls the hooks through the Service, i.e. on any replica: serve them on
            # every replica, leader or not (returns at once when the extension is off).
            tg.start_soon(functools.partial(
                serve_configured_extension, config, mgmt=mgmt,
                tracer=get_tracer("fleet.extension", provider)))
            try:
                if args.leader_elect:
                    elector = LeaderElector(mgmt, namespace=config.management.namespace,
                                            identity=args.identity,
                                            lease_seconds=args.lease_seconds)
                    await elector.run(lead)
                else:
                    await lead()
            except LostLeadershipError as e:
                log.error("%s", e)
                return 3
            tg.cancel_scope.cancel()
        return 0
    finally:
        with anyio.CancelScope(shield=True):
            await mgmt.close()
            provider.shutdown()


def run(args: argparse.Namespace) -> int:
    import anyio  # noqa: PLC0415

    from fleet.config import ConfigError, load_config  # noqa: PLC0415

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"k0s-fleet: config: {line}", file=sys.stderr)
        return 2
    return anyio.run(_main, args, config)
