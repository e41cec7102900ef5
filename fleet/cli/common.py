"""What the commands share: the fleet config from ``--config``/``--kubeconfig``/``--context``,
one way to report a bad config, exit codes, and the management cluster's client."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from enum import IntEnum

import anyio

from fleet.config import FleetConfig
from fleet.config_errors import ConfigError
from fleet.config_loader import load_config
from fleet.kube import KubeClient, KubeError


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # the command ran and failed (unreachable cluster, rollout not done, ...)
    BAD_CONFIG = 2  # the fleet config or the agent settings are unusable
    LOST_LEADERSHIP = 3  # the controller lost its Lease (its Pod restarts)
    NOT_DONE = 3  # upgrade: not complete within --timeout
    INTERRUPTED = 130


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """--config, --kubeconfig and --context, as every fleet-side command takes them."""
    p.add_argument("--config", help="fleet YAML (default: $K0S_FLEET_CONFIG, else defaults)")
    p.add_argument("--kubeconfig", help="management cluster kubeconfig (overrides the "
                   "config's management.kubeconfig; default: in-cluster service account)")
    p.add_argument("--context", help="kubeconfig context")


def add_output_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")


def fleet_config(args: argparse.Namespace) -> FleetConfig:
    """The fleet config (``--config``, else ``$K0S_FLEET_CONFIG``, else defaults) with
    ``--kubeconfig``/``--context`` applied. Raises :class:`ConfigError`."""
    given = {k: v for k, v in (("kubeconfig", args.kubeconfig), ("context", args.context)) if v}
    return load_config(args.config, overrides={"management": given} if given else None)


def report_config_error(command: str, e: ConfigError) -> int:
    """One line per problem on stderr, each naming its key; the exit code to return."""
    for line in str(e).splitlines():
        print(f"k0s-fleet {command}: config: {line}", file=sys.stderr)
    return Exit.BAD_CONFIG


def fail(command: str, message: object) -> int:
    print(f"k0s-fleet {command}: {message}", file=sys.stderr)
    return Exit.FAILED


def run_command(command: str, main: Callable[[argparse.Namespace], Awaitable[int]],
                args: argparse.Namespace, *, bad_input: tuple[type[Exception], ...] = (),
                failures: tuple[type[Exception], ...] = ()) -> int:
    """``main(args)`` under anyio, its errors as exit codes with one line each on stderr:
    a bad config (a line per problem) or ``bad_input`` is :attr:`Exit.BAD_CONFIG`; an
    API error, an OS error, a ValueError or one of ``failures`` is :attr:`Exit.FAILED`;
    Ctrl-C is :attr:`Exit.INTERRUPTED`."""
    failed: tuple[type[Exception], ...] = (KubeError, OSError, ValueError, *failures)
    try:
        return anyio.run(main, args)
    except ConfigError as e:
        return report_config_error(command, e)
    except bad_input as e:
        print(f"k0s-fleet {command}: {e}", file=sys.stderr)
        return Exit.BAD_CONFIG
    except failed as e:
        return fail(command, e)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED


async def management_client(config: FleetConfig) -> KubeClient:
    """A client for the management cluster: ``management.kubeconfig`` (and context), else
    the in-cluster service account."""
    m = config.management
    if m.kubeconfig:
        return await KubeClient.from_kubeconfig_file(m.kubeconfig, name="management",
                                                     context=m.context, transport="auto")
    try:
        return KubeClient.in_cluster(name="management", transport="auto")
    except Exception as e:  # KubeconfigError, or kubernetes_asyncio's ConfigException
        raise ValueError("no management kubeconfig: pass --kubeconfig or set "
                         f"management.kubeconfig (not running in a cluster: {e})") from None
